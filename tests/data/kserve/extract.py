"""Writes the openAPIV3Schema of a KServe CRD version as the small JSON file beside this one
that tests/test_kubernetes.py validates the KServe example against (README.md here says
where the CRDs came from).

    python tests/data/kserve/extract.py CRD.yaml VERSION OUT.json

Two changes, neither of which changes what validates: every `description` string is dropped,
and every subtree of 300 characters or more that occurs more than once (a container's, a
probe's, a volume's schema...) is written once under `$defs` and referred to by `$ref`. The
result is checked: with every `$ref` put back, it equals the CRD's schema without its
descriptions.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

SHARED = 300  # characters: shorter repeats stay inline


def text(node: Any) -> str:
    return json.dumps(node, sort_keys=True, separators=(",", ":"))


def without_descriptions(node: Any) -> Any:
    if isinstance(node, dict):  # a property named "description" is a schema, not a string
        return {k: without_descriptions(v) for k, v in node.items()
                if not (k == "description" and isinstance(v, str))}
    if isinstance(node, list):
        return [without_descriptions(v) for v in node]
    return node


def factored(schema: dict[str, Any]) -> dict[str, Any]:
    seen: Counter[str] = Counter()

    def count(node: Any, is_schema: bool) -> None:
        if isinstance(node, dict):
            if is_schema and len(text(node)) >= SHARED:
                seen[text(node)] += 1
            for key, value in node.items():
                if key == "properties":
                    for child in value.values():
                        count(child, True)
                elif key in ("items", "additionalProperties", "not"):
                    count(value, True)
                elif key in ("allOf", "anyOf", "oneOf"):
                    for child in value:
                        count(child, True)
    count(schema, False)
    names = {t: "s" + hashlib.sha256(t.encode()).hexdigest()[:10] for t, n in seen.items()
             if n > 1}

    def rewrite(node: Any, is_schema: bool, top: bool = False) -> Any:
        if isinstance(node, dict):
            if is_schema and not top and text(node) in names:
                return {"$ref": f"#/$defs/{names[text(node)]}"}
            out: dict[str, Any] = {}
            for key, value in node.items():
                if key == "properties":
                    out[key] = {k: rewrite(v, True) for k, v in value.items()}
                elif key in ("items", "additionalProperties", "not"):
                    out[key] = rewrite(value, True)
                elif key in ("allOf", "anyOf", "oneOf"):
                    out[key] = [rewrite(v, True) for v in value]
                else:
                    out[key] = value
            return out
        return node
    result: dict[str, Any] = rewrite(schema, False)
    result["$defs"] = {name: rewrite(json.loads(t), True, top=True)
                       for t, name in sorted(names.items(), key=lambda item: item[1])}
    return result


def expanded(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, dict):
        if set(node) == {"$ref"}:
            return expanded(defs[node["$ref"].rpartition("/")[2]], defs)
        return {k: expanded(v, defs) for k, v in node.items() if k != "$defs"}
    if isinstance(node, list):
        return [expanded(v, defs) for v in node]
    return node


def main(crd_file: str, version: str, out: str) -> None:
    crd = yaml.load(Path(crd_file).read_text(), Loader=getattr(yaml, "CSafeLoader",
                                                                  yaml.SafeLoader))
    (found,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    plain = without_descriptions(found["schema"]["openAPIV3Schema"])
    small = factored(plain)
    assert expanded(small, small["$defs"]) == plain  # nothing but the form changed
    Path(out).write_text(text(small) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:])
