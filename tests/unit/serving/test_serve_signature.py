"""Predict inputs checked against a model's signature (each refusal names the input and
has the kind that picks its 4xx), and the pydantic models generated from it."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from triplane.proto.errors import DTypeError, ShapeError
from triplane.scheduler.api.errors import status_of
from triplane.scheduler.errors import BadRequest, TooLarge
from triplane.serving.signature import (
    Spec,
    batchable,
    check_inputs,
    encode_tensor,
    request_model,
    response_model,
)

SPECS = [Spec("image", "float32", (None, 1, 2)), Spec("ids", "int64", (None,))]


def _ok() -> dict[str, object]:
    return {"image": [[[0.5, 1]], [[2, 3]]], "ids": [1, 2]}


def test_nested_lists_and_raw_tensors_become_arrays_of_the_signature() -> None:
    image, ids = check_inputs(SPECS, _ok(), max_rows=4)
    assert image.dtype == np.float32 and image.shape == (2, 1, 2)
    assert ids.dtype == np.int64 and list(ids) == [1, 2]
    raw = encode_tensor(np.arange(4, dtype=np.float32).reshape(2, 1, 2))
    image2, _ = check_inputs(SPECS, {"image": raw, "ids": np.array([1, 2])}, max_rows=4)
    np.testing.assert_array_equal(image2, np.arange(4).reshape(2, 1, 2))


@pytest.mark.parametrize("change,error,kind,match", [
    ({"image": [[0.5, 1], [2, 3]]}, ShapeError, "shape", "input 'image' has shape \\[2, 2\\]"),
    ({"image": [[[0.5, 1, 2]], [[2, 3, 4]]]}, ShapeError, "shape", "input 'image'.*float32\\[\\*, 1, 2\\]"),
    ({"ids": [1]}, ShapeError, "shape", "leading .batch. dimensions differ"),
    ({"ids": [[1], [2, 3]]}, BadRequest, "request", "input 'ids'"),
    ({"ids": [1.5, 2.5]}, DTypeError, "dtype", "input 'ids': float64 values for an input of int64"),
    ({"ids": ["1", "2"]}, BadRequest, "request", "input 'ids'.*numbers"),
    ({"image": encode_tensor(np.zeros((2, 1, 2), np.float64))}, DTypeError, "dtype",
     "input 'image' has dtype float64, the model takes float32"),
    ({"image": {"shape": [2, 1, 2], "dtype": "float32", "data": "AAAA"}}, BadRequest, "request",
     "input 'image'.*16 bytes"),
    ({"image": {"shape": [2, 1, 2], "dtype": "complex7", "data": ""}}, DTypeError, "dtype",
     "input 'image': unknown dtype"),
    ({"extra": [1]}, BadRequest, "request", "unknown input.*extra"),
])
def test_bad_inputs_are_refused_naming_the_input(change: dict[str, object], error: type[Exception], kind: str,
                                                 match: str) -> None:
    given = {**_ok(), **change}
    with pytest.raises(error, match=match) as e:
        check_inputs(SPECS, given, max_rows=4)
    assert getattr(e.value, "kind", None) == kind and status_of(kind) == 400


def test_missing_inputs_and_too_many_rows() -> None:
    with pytest.raises(BadRequest, match="missing input 'ids'"):
        check_inputs(SPECS, {"image": _ok()["image"]}, max_rows=4)
    with pytest.raises(TooLarge, match="3 rows; one request may carry at most 2") as e:
        check_inputs(SPECS, {"image": np.zeros((3, 1, 2), np.float32), "ids": np.zeros(3, np.int64)},
                     max_rows=2)
    assert status_of(e.value.kind) == 413


def test_batchable_needs_a_dynamic_leading_dimension_everywhere() -> None:
    assert batchable(SPECS, [Spec("y", "float32", (None, 3))])
    assert not batchable(SPECS, [Spec("y", "float32", (3,))])
    assert not batchable([Spec("x", "float32", (2, 3))], [Spec("y", "float32", (None,))])


def test_the_request_model_types_every_input() -> None:
    model = request_model(SPECS)
    schema = model.model_json_schema()
    inputs = schema["$defs"]["PredictInputs"]
    assert inputs["required"] == ["image", "ids"] and inputs["additionalProperties"] is False
    image = inputs["properties"]["image"]["anyOf"][0]
    assert image["items"]["minItems"] == image["items"]["maxItems"] == 1  # the fixed dimension
    assert image["items"]["items"]["items"]["type"] == "number"
    assert inputs["properties"]["ids"]["anyOf"][0]["items"]["type"] == "integer"
    model.model_validate({"inputs": _ok()})
    with pytest.raises(ValidationError, match="ids"):
        model.model_validate({"inputs": {**_ok(), "ids": ["one", 2]}})
    with pytest.raises(ValidationError, match="image"):
        model.model_validate({"inputs": {**_ok(), "image": [[[1, 2, 3]]]}})
    out = response_model([Spec("y", "float32", (None, 3))]).model_json_schema()
    assert out["required"] == ["outputs", "model_version"]
