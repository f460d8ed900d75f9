"""The README's code blocks that quote an example are the example, byte for byte; and every
link between README.md and docs/*.md lands on a file and heading that exist.

A block is tied to its file by the line before its fence, `<!-- example: examples/NAME -->`; the
fenced text must equal the file. Checked for README.md and docs/*.md; a marker with no block, a
missing file or a difference is an error (with a diff), so the documentation cannot drift from
code that the test command builds and runs.
Usage: readme_blocks.py SOURCE_DIR
"""
import difflib
import pathlib
import re
import sys

root = pathlib.Path(sys.argv[1])
marker = re.compile(r"^<!-- example: (\S+) -->\n```[a-z]*\n(.*?)^```", re.S | re.M)
errors, checked = [], 0
for doc in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
    text = doc.read_text()
    found = marker.findall(text)
    if text.count("<!-- example:") != len(found):
        errors.append(f"{doc.name}: a '<!-- example: ... -->' marker is not followed by a fenced block")
    for path, block in found:
        f = root / path
        if not f.is_file():
            errors.append(f"{doc.name}: quotes {path}, which does not exist")
            continue
        want = f.read_text()
        checked += 1
        if block != want:
            diff = "".join(difflib.unified_diff(want.splitlines(True), block.splitlines(True), path, doc.name))
            errors.append(f"{doc.name}: the block quoting {path} differs from it:\n{diff}")


# Links [text](file.md#anchor) and [text](#anchor): the file exists and has a heading whose
# GitHub anchor (lower case, punctuation dropped, spaces as '-') is the anchor.
def anchors(md):
    out = set()
    for line in md.read_text().splitlines():
        m = re.match(r"^#+\s+(.*)", line)
        if m:
            out.add(re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-"))
    return out


link = re.compile(r"\]\(([^)#\s]*\.md)?(?:#([^)\s]+))?\)")
for doc in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
    for m in link.finditer(doc.read_text()):
        if not m.group(1) and not m.group(2):
            continue
        target = (doc.parent / m.group(1)).resolve() if m.group(1) else doc
        checked += 1
        if not target.is_file():
            errors.append(f"{doc.name}: link {m.group(0)[1:]} names a file that does not exist")
        elif m.group(2) and m.group(2) not in anchors(target):
            errors.append(f"{doc.name}: link {m.group(0)[1:]} names no heading of {target.name}")
for e in errors:
    print("FAIL:", e)
print(f"README blocks: {checked - len([e for e in errors if 'differs' in e])} passed, {len(errors)} failed")
sys.exit(1 if errors or checked == 0 else 0)
