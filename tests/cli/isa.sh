#!/usr/bin/env bash
# One build, every ISA: no instruction of AVX-512 (ZMM or opmask registers, registers 16-31, the
# EVEX-only forms) anywhere in the binary outside the AVX-512 copy of the kernels
# (clattn::mk::avx512::), which only a CPU with AVX-512 is dispatched to; and, where Debian's
# qemu-user is installed, the binary run on QEMU's emulated CPU (AVX2, no AVX-512) gives the
# native result.
# Usage: bash tests/cli/isa.sh /path/to/clattn
set -u
bin=${1:?usage: isa.sh /path/to/clattn}
source "$(dirname "$0")/lib.sh"

stray=$(objdump -d --no-show-raw-insn -C "$bin" |
  awk '/^[0-9a-f]+ <.*>:$/ {fn=$0; next}
       /%zmm|%k[0-7]|%[xy]mm(1[6-9]|2[0-9]|3[01])|vpternlog|vpermt2|vpermi2|\{%k/ { if (fn !~ /::avx512::/) print fn }' |
  sort -u | head -n 5)
[ -z "$stray" ] && ok || bad "AVX-512 instructions outside clattn::mk::avx512:: (would die on an AVX2 CPU): $stray"
objdump -d --no-show-raw-insn -C "$bin" | grep -q 'clattn::mk::avx512::' && ok || bad "no AVX-512 copy of the kernels in the binary"

if command -v qemu-x86_64 >/dev/null; then
  expect_ok "make-inputs" "$bin" make-inputs --output "$dir/in.safetensors" --batch 1 --heads 2 --n 65 --m 70 --dim 16 --with-grad
  expect_ok "attend natively" "$bin" attend --spec improved-clustered:clusters=5,topk=4 --input "$dir/in.safetensors" --output "$dir/native.safetensors"
  expect_ok "attend under qemu -cpu max" qemu-x86_64 -cpu max "$bin" attend --spec improved-clustered:clusters=5,topk=4 --input "$dir/in.safetensors" --output "$dir/qemu.safetensors"
  /usr/bin/python3 "$(dirname "$0")/st_compare.py" "$dir/qemu.safetensors" "$dir/native.safetensors" 1e-5 && ok || bad "qemu result differs from the native one"
  expect_ok "variants under qemu" qemu-x86_64 -cpu max "$bin" variants
  expect_error "CLATTN_ISA=avx512 under qemu (no AVX-512)" "lacks" env CLATTN_ISA=avx512 qemu-x86_64 -cpu max "$bin" variants
else
  echo "note: qemu-x86_64 not installed (Debian qemu-user): the emulated-CPU run is skipped"
fi
finish ""
