"""tensorwire from Python: a client of tensorwire's nodes (docs/protocol.md)
and a reader of its datasets (docs/format.md).

    import tensorwire
    buf = tensorwire.replay.Buffer("127.0.0.1:7070", "sig", token=..., root="/mnt/shared")
    buf.extend({"obs": obs, "action": action})
    batch, info = buf.sample(256)
    policy = tensorwire.serve.Client("127.0.0.1:7070", "policy", token=..., root="/mnt/shared")
    out = policy.predict({"obs": obs})      # or predict_async / await apredict, many at once

Pure Python over numpy and msgpack; torch is optional (tensors come back as
numpy arrays, or torch tensors with as_torch=True).
"""

from .errors import *  # noqa: F401,F403
from .errors import __all__ as _errors_all
from ._td import NonTensorData, DTYPES
from .rpc import Client, Sharing, TD, read_token
from .dataset import load_memmap
from . import loader, replay, serve, store

__version__ = "0.1.0"

__all__ = ["Client", "Sharing", "TD", "NonTensorData", "DTYPES", "read_token", "load_memmap", "loader", "replay", "serve", "store"] + list(_errors_all)

# tensorwire.Node: a node started from Python (node.py).
from .node import Node  # noqa: E402
__all__ += ["Node"]
