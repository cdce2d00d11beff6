"""The exceptions triplane raises, in one tree.

    TriplaneError                 base of everything below
    ├── GraphError                a graph (or a node of it) is malformed
    │   ├── UnknownOpError        the op name is not in the op table
    │   ├── ShapeError            shapes do not fit the op
    │   ├── DTypeError            dtypes do not fit the op (or are unknown)
    │   ├── AttrError             an attribute is missing, unknown or of the wrong type
    │   └── LimitError            a size bound (nodes, elements, bytes) is exceeded
    ├── NotDifferentiableError    a gradient was asked through an op that has none
    ├── ModelFileError            a model file is refused; ``kind`` says why (corrupted,
    │                             truncated, tampered, unsupported_version, ...)
    └── KernelError               a kernel raised while running (a user error: not retried)

Every GraphError names the node and op it is about, when it is about one, so that a
message reads ``node 'y' (matmul): inner dimensions differ: (64, 784) @ (10, 784)``.

Every error carries ``kind``, a machine-readable word a client can act on ("graph",
"shape", "not_found", "standby", ...): the API's error body carries it, and the API maps
it to a status code (``triplane/scheduler/api/errors.py``, the one table). The scheduler's
own errors (not found, not ready, unavailable, standby...) extend this tree in
``triplane/scheduler/errors.py``.
"""

from __future__ import annotations


class TriplaneError(Exception):
    """Base class of every error triplane raises on purpose."""

    kind: str = "internal"


class GraphError(TriplaneError, ValueError):
    """A graph or one of its nodes is malformed."""

    kind = "graph"

    def __init__(self, message: str, *, node: str | None = None, op: str | None = None,
                 where: str | None = None) -> None:
        self.node = node
        self.op = op
        self.where = where
        self.reason = message
        super().__init__(self._compose())

    def _compose(self) -> str:
        prefix = ""
        if self.node is not None and self.op is not None:
            prefix = f"node {self.node!r} ({self.op}): "
        elif self.node is not None:
            prefix = f"node {self.node!r}: "
        elif self.op is not None:
            prefix = f"{self.op}: "
        suffix = f" (at {self.where})" if self.where else ""
        return f"{prefix}{self.reason}{suffix}"

    def at(self, *, node: str | None = None, op: str | None = None,
           where: str | None = None) -> GraphError:
        """The same error, located at a node/op/source line (fields already set are kept)."""
        self.node = self.node if self.node is not None else node
        self.op = self.op if self.op is not None else op
        self.where = self.where if self.where is not None else where
        self.args = (self._compose(),)
        return self


class UnknownOpError(GraphError):
    kind = "unknown_op"


class ShapeError(GraphError):
    kind = "shape"


class DTypeError(GraphError, TypeError):
    kind = "dtype"


class AttrError(GraphError):
    kind = "attr"


class LimitError(GraphError):
    kind = "limit"


class NotDifferentiableError(TriplaneError):
    kind = "not_differentiable"


class KernelError(TriplaneError):
    """A kernel raised on its inputs. ``kind`` is ``"user"`` (bad data: not retried)."""

    def __init__(self, message: str, *, node: str | None = None, op: str | None = None,
                 kind: str = "user") -> None:
        self.node, self.op, self.kind = node, op, kind
        where = f"node {node!r} ({op}): " if node else (f"{op}: " if op else "")
        super().__init__(where + message)


class ModelFileError(TriplaneError, ValueError):
    """A model file (``triplane/proto/modelfile.py``) was refused. ``kind`` is one word
    saying why; the message says the same in a sentence and names the file:

    ``not_a_model``         the file does not start with the model file's magic bytes
    ``truncated``           the file ends before the length its header records
    ``corrupted``           bytes differ from their recorded SHA-256 (or cannot be parsed)
    ``unsupported_version`` written in a newer format than this triplane reads
    ``unsigned``            a key was given but the file carries no signature
    ``bad_signature``       the signature is malformed, of another algorithm than the
                            key, or made with another key
    ``tampered``            the signature does not verify: the file changed after signing
    ``unknown_op``          the graph uses an op this process does not know (a custom op
                            not registered)
    """

    kind = "model_file"  # each instance says which check: one of the words above

    def __init__(self, kind: str, message: str) -> None:
        self.kind = kind
        super().__init__(message)
