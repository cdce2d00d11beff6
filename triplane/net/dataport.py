"""The data port: tiles between nodes over TCP (the wire format: ``proto/dataport.md``).

One server and one client for every node. ``DataServer`` serves a ``TileSource`` -- the
executor's memory engine (``triplane.executor.dataport.EngineTiles``) or the scheduler's
uploads (``triplane.scheduler.store.UploadTiles``, read-only). ``DataClient`` is what
executors pull inputs with and what the scheduler streams results and releases tiles with.

Trust. Every request and every response is authenticated with the cluster secret, and
tags are checked before anything is parsed; a response is bound to its request's nonce;
data travels in tagged chunks and is handed out only once its chunk's tag matched. So a
peer without the secret -- a poisoned registry address, a stranger on the network -- can
make a request fail (``DataPortError`` of kind ``unauthenticated``), never give it data.

Failure semantics. The server answers every request it can read; a request it cannot
authenticate gets a refusal (``proto.dataport.refusal``) and the connection is closed, as
does a stale or replayed one. ``missing`` and ``full`` answers keep the connection (a
``put`` that does not fit is drained first). The server never dies from one connection,
and holds every connection to the port's ``Limits`` (``triplane.net.guard``). The client
raises ``DataPortError`` for everything (``kind`` says what); a pooled connection found
dead before any answer is retried once on a fresh one (with a fresh nonce).

Tiles stream without extra copies: the server sends the stored array's buffer
(``sock_sendall`` of a memoryview) and the client receives into a preallocated
``np.empty`` (``sock_recv_into``). Raw bytes are C order, little-endian.
"""

from triplane.net.dataclient import DataClient
from triplane.net.dataserver import DataServer, TileSource
from triplane.net.sockio import byte_view
from triplane.proto.dataport import DataPortError, Response

__all__ = ["DataClient", "DataPortError", "DataServer", "Response", "TileSource", "byte_view"]
