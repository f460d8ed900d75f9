# st_scale.py FILE OUT NAME:ROW:FACTOR ...: a copy of the safetensors file FILE with row ROW of head 0,
# batch 0 of the F32 (B, H, N, D) tensor NAME multiplied by FACTOR (nan allowed): inputs that break
# one rank's slice only, for tests/cli/seq_parallel.sh.
import json, struct, sys
b = bytearray(open(sys.argv[1], 'rb').read())
n = struct.unpack('<Q', b[:8])[0]
hdr = json.loads(b[8:8 + n])
for spec in sys.argv[3:]:
    name, row, factor = spec.split(':')
    t = hdr[name]
    D = t['shape'][3]
    base = 8 + n + t['data_offsets'][0] + int(row) * D * 4
    vals = struct.unpack(f'<{D}f', b[base:base + D * 4])
    b[base:base + D * 4] = struct.pack(f'<{D}f', *[v * float(factor) for v in vals])
open(sys.argv[2], 'wb').write(b)
