"""A pure-Python rendering of the kustomize features deploy/kubernetes/ uses, so the tests
render the manifests where kubectl is absent (CI). Where kubectl exists, the tests render
with `kubectl kustomize` too and compare (tests/test_kubernetes.py).

Supported, and nothing else (an unknown field in a kustomization.yaml is an error, so a
feature added to the manifests cannot be silently ignored here):
resources (files and directories), namespace, configMapGenerator (files; behavior create or
replace; the name suffixed with a hash of the content, and references to it in pod
templates renamed), images (newName, newTag), and patches given as RFC 6902 JSON patches in
a file, with a target by group, version, kind and name.
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Any

import yaml

Obj = dict[str, Any]
KNOWN = {"apiVersion", "kind", "namespace", "resources", "configMapGenerator", "images",
         "patches"}
# Kinds without a namespace (the namespace transformer leaves them alone).
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition",
                  "PriorityClass", "StorageClass", "PersistentVolume"}


class KustomizeError(Exception):
    pass


def render(directory: Path) -> list[Obj]:
    objects, _ = _build(directory)
    return objects


def _build(directory: Path) -> tuple[list[Obj], dict[str, str]]:
    """The objects, and generated ConfigMap names (plain name -> hashed name)."""
    spec = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unknown = set(spec) - KNOWN
    if unknown:
        raise KustomizeError(f"{directory}: unsupported kustomization fields {sorted(unknown)}")
    objects: list[Obj] = []
    generated: dict[str, Obj] = {}  # plain name -> ConfigMap (before hashing)
    for entry in spec.get("resources", []):
        path = directory / entry
        if path.is_dir():
            sub, names = _build(path)
            plain_names = {hashed: plain for plain, hashed in names.items()}
            for obj in sub:
                for volume in _pod_spec(obj).get("volumes", []):
                    ref = volume.get("configMap")
                    if ref and ref["name"] in plain_names:
                        ref["name"] = plain_names[ref["name"]]
                plain = _plain_name(obj, names)
                if plain is not None:
                    generated[plain] = obj
                else:
                    objects.append(obj)
        else:
            objects.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    for gen in spec.get("configMapGenerator", []):
        behavior = gen.get("behavior", "create")
        unknown = set(gen) - {"name", "files", "behavior"}
        if unknown or behavior not in ("create", "replace"):
            raise KustomizeError(f"unsupported configMapGenerator entry {gen}")
        if (behavior == "create") == (gen["name"] in generated):
            raise KustomizeError(f"configMapGenerator {gen['name']}: behavior {behavior}")
        data = {}
        for item in gen["files"]:
            key, _, file = item.rpartition("=") if "=" in item else (Path(item).name, "", item)
            data[key] = (directory / file).read_text()
        if behavior == "replace":  # the base's metadata (its namespace) stays
            generated[gen["name"]]["data"] = data
        else:
            generated[gen["name"]] = {"apiVersion": "v1", "kind": "ConfigMap",
                                      "metadata": {"name": gen["name"]}, "data": data}
    for patch in spec.get("patches", []):
        unknown = set(patch) - {"path", "target"}
        if unknown:
            raise KustomizeError(f"unsupported patch fields {sorted(unknown)}")
        ops = yaml.safe_load((directory / patch["path"]).read_text())
        targets = [o for o in objects if _matches(o, patch["target"])]
        if not targets:
            raise KustomizeError(f"patch {patch['path']}: no object matches {patch['target']}")
        for obj in targets:
            json_patch(obj, ops)
    for image in spec.get("images", []):
        for obj in objects:
            for container in _containers(obj):
                name, tag = _split_image(container["image"])
                if name == image["name"]:
                    container["image"] = (f"{image.get('newName', name)}:"
                                          f"{image.get('newTag', tag)}")
    namespace = spec.get("namespace")
    if namespace:
        for obj in [*objects, *generated.values()]:
            if obj["kind"] not in CLUSTER_SCOPED:
                obj["metadata"]["namespace"] = namespace
    names = {}
    for plain, cm in generated.items():
        hashed = f"{plain}-{configmap_hash(cm)}"
        names[plain] = hashed
        cm = copy.deepcopy(cm)
        cm["metadata"]["name"] = hashed
        objects.append(cm)
    for obj in objects:
        for volume in _pod_spec(obj).get("volumes", []):
            ref = volume.get("configMap")
            if ref and ref["name"] in names:
                ref["name"] = names[ref["name"]]
    return objects, names


def _plain_name(obj: Obj, names: dict[str, str]) -> str | None:
    """A generated ConfigMap of a base comes back as its plain self: an overlay may replace
    it, and it is hashed once, at the top."""
    if obj["kind"] != "ConfigMap":
        return None
    for plain, hashed in names.items():
        if obj["metadata"]["name"] == hashed:
            obj["metadata"]["name"] = plain
            return plain
    return None


def configmap_hash(cm: Obj) -> str:
    """kustomize's documented suffix: the first 10 hex digits of the SHA-256 of
    {"data", "kind", "name"} as Go's json.Marshal writes it, vowels and vowel-like digits
    mapped to consonants. (The kubectl on the development machine computes a different
    suffix; the comparison with kubectl therefore leaves suffixes out.)"""
    encoded = json.dumps({"data": cm["data"], "kind": "ConfigMap",
                          "name": cm["metadata"]["name"]}, sort_keys=True,
                         separators=(",", ":"), ensure_ascii=False)
    for char, escape in (("&", "\\u0026"), ("<", "\\u003c"), (">", "\\u003e")):
        encoded = encoded.replace(char, escape)
    digest = hashlib.sha256(encoded.encode()).hexdigest()[:10]
    return digest.translate(str.maketrans("013ae", "ghkmt"))


def _matches(obj: Obj, target: dict[str, str]) -> bool:
    group, _, version = obj["apiVersion"].rpartition("/")
    want = {"group": group, "version": version, "kind": obj["kind"],
            "name": obj["metadata"]["name"]}
    return all(want.get(k) == v for k, v in target.items())


def _pod_spec(obj: Obj) -> Obj:
    spec: Obj = obj.get("spec", {}).get("template", {}).get("spec", {})
    return spec


def _containers(obj: Obj) -> list[Obj]:
    spec = _pod_spec(obj)
    return [*spec.get("initContainers", []), *spec.get("containers", [])]


def _split_image(image: str) -> tuple[str, str | None]:
    name, sep, tag = image.rpartition(":")
    if not sep or "/" in tag:
        return image, None
    return name, tag


# --- RFC 6902 ------------------------------------------------------------------------------

def json_patch(doc: Obj, ops: list[Obj]) -> None:
    for op in ops:
        *parents, last = [p.replace("~1", "/").replace("~0", "~")
                          for p in op["path"].split("/")[1:]]
        parent: Any = doc
        for part in parents:
            parent = parent[int(part)] if isinstance(parent, list) else parent[part]
        kind = op["op"]
        if isinstance(parent, list):
            index = len(parent) if last == "-" else int(last)
            if kind == "add":
                parent.insert(index, op["value"])
            elif kind == "replace":
                parent[index] = op["value"]
            elif kind == "remove":
                del parent[index]
            else:
                raise KustomizeError(f"unsupported op {kind}")
        elif kind == "add":
            parent[last] = op["value"]
        elif kind == "replace":
            if last not in parent:
                raise KustomizeError(f"replace: {op['path']} does not exist")
            parent[last] = op["value"]
        elif kind == "remove":
            del parent[last]
        else:
            raise KustomizeError(f"unsupported op {kind}")
