#!/usr/bin/env python3
"""The Kubernetes manifests (tools/k8s/) against the API's schemas.

Every document of every *.yaml file is validated strictly (unknown fields
are errors) with kubernetes-validate, whose schemas are bundled (no network),
against the first Kubernetes version with resource.k8s.io/v1 (DRA). A
self-check first: a manifest with a misspelt field must fail, so the check
cannot pass by validating nothing.

Usage: k8s_manifests_test.py DIR. Exit 0: all valid; 1: a failure; 77: the
validator is not installed (pip install kubernetes-validate).
"""
import copy
import pathlib
import sys

VERSION = "1.34.0"


def main():
    try:
        import kubernetes_validate
        import yaml
    except ImportError as error:
        print(f"SKIP: {error.name} is not installed (pip install kubernetes-validate)")
        return 77

    def check(document):
        kubernetes_validate.validate(document, VERSION, strict=True)

    files = sorted(pathlib.Path(sys.argv[1]).glob("*.yaml"))
    documents = [(f.name, d) for f in files for d in yaml.safe_load_all(f.read_text()) if d is not None]
    if not documents:
        print(f"FAIL: no manifests in {sys.argv[1]}")
        return 1

    pod = next(d for _, d in documents if d["kind"] == "Pod")
    broken = copy.deepcopy(pod)
    broken["spec"]["containers"][0]["resourcez"] = broken["spec"]["containers"][0].pop("resources")
    try:
        check(broken)
        print("FAIL: the validator accepted a Pod with a misspelt field ('resourcez')")
        return 1
    except kubernetes_validate.ValidationError:
        pass

    failures = 0
    for name, document in documents:
        what = f"{name}: {document.get('kind')}/{document.get('metadata', {}).get('name')}"
        try:
            check(document)
            print(f"ok {what}")
        except (kubernetes_validate.ValidationError, kubernetes_validate.SchemaNotFoundError) as error:
            print(f"FAIL {what}: {error}")
            failures += 1
    print(f"{len(documents) - failures} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
