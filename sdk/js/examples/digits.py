"""Write scikit-learn's digits (bundled with it: nothing is downloaded) as the JSON file
examples/mlp.mjs trains on: {"n", "features", "classes", "x": [n * features floats in
0..1, row-major], "y": [n labels]}.

    python3 sdk/js/examples/digits.py digits.json
"""

from __future__ import annotations

import json
import sys

from sklearn.datasets import load_digits


def main(path: str) -> None:
    digits = load_digits()
    x = (digits.data / 16.0).astype("float32")
    doc = {"n": int(x.shape[0]), "features": int(x.shape[1]), "classes": 10,
           "x": [round(float(v), 6) for v in x.ravel()], "y": [int(v) for v in digits.target]}
    with open(path, "w") as f:
        json.dump(doc, f)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python3 digits.py OUT.json")
    main(sys.argv[1])
