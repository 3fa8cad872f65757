"""Print the method names of ``service ThriftHiveMetastore`` in a Thrift IDL file, sorted.

How the lists next to this file were made: ``python extract.py hive_metastore.thrift`` on the
source each list's header names. Only the service block is read (comments dropped); a name is
an identifier followed by ``(`` outside any parentheses, ``throws`` excepted. fb303's
FacebookService methods are not part of the lists.
"""

from __future__ import annotations

import re
import sys


def methods(text: str) -> list[str]:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"(//|#)[^\n]*", " ", text)
    start = text.index("service ThriftHiveMetastore")
    body = text[text.index("{", start) + 1 :]
    names: list[str] = []
    depth = 0
    for match in re.finditer(r"[A-Za-z_]\w*|[(){}]", body):
        token = match.group()
        if token == "(":
            depth += 1
        elif token == ")":
            depth -= 1
        elif token == "}" and depth == 0:
            break
        elif (
            depth == 0
            and token not in ("throws", "oneway", "void")
            and body[match.end() :].lstrip().startswith("(")
        ):
            names.append(token)
    return names


def main(path: str) -> None:
    with open(path, encoding="utf-8") as f:
        names = methods(f.read())
    if len(names) != len(set(names)):
        raise SystemExit(f"{path}: a method is declared twice")
    print("\n".join(sorted(names)))


if __name__ == "__main__":
    main(sys.argv[1])
