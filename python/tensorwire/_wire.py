"""The handshake and the message framing of docs/protocol.md."""

import hashlib
import hmac
import os
import stat
import struct
import tempfile

from . import _msgpack
from .errors import from_wire, TensorwireError

MAGIC = b"TWRP"
PROTOCOL_VERSION = 1  # the golden examples' version
# The newest version this client speaks: 4, the where messages that decide
# a connection's sharing. Version 2 brought message streams and LZ4 bodies
# (it asks for uncompressed ones unless made with compression=True, which
# decodes them with the lz4 package: _lz4.py); version 3 side connections, which this client never
# opens (docs/protocol.md: they are optional), so of version 3 it reads
# only the session message.
NEWEST_VERSION = 4
SESSION_VERSION = 3  # the first version whose server sends a session message
SHARING_VERSION = 4  # the first version with the where messages
HELLO_SIZE = 64
PROOF_SIZE = 32
FLAG_TOKEN = 1
MAX_STATUS_MSG = 1024
CLIENT_PROOF_LABEL = b"tensorwire client proof"
SERVER_PROOF_LABEL = b"tensorwire server proof"
FSID_FILE = ".tensorwire-fsid"
ZERO_FSID = bytes(16)
SESSION_MSG_SIZE = 40
PROBE_DIR = ".tensorwire-probe"
SERVER_WHERE_SIZE = 48
CLIENT_WHERE_SIZE = 40
BOOT_ID_FILE = "/proc/sys/kernel/random/boot_id"

# Sharing levels (docs/protocol.md, "Sharing"), in order: what a connection's
# two sides share of the node's root.
NONE, STORAGE, COHERENT = "none", "storage", "coherent"
LEVELS = (NONE, STORAGE, COHERENT)  # index: the level's byte in the client's where message

# What this client accepts in a response (the server's defaults).
MAX_HEADER_BYTES = 64 << 10
MAX_ARG_BYTES = 16 << 20
MAX_BODY_BYTES = 4 << 30


class ProtocolError(Exception):
    """Bytes from the peer that break the protocol: the connection cannot be
    followed any further."""


def hello(flags, nonce, fsid, version=PROTOCOL_VERSION):
    """The 64-byte hello (docs/protocol.md, "Hello")."""
    if len(nonce) != 32 or len(fsid) != 16:
        raise ValueError("a hello needs a 32-byte nonce and a 16-byte filesystem identity")
    return MAGIC + bytes((version, flags, 0, 0)) + bytes(nonce) + bytes(fsid) + bytes(8)


def parse_hello(b):
    """Returns (version, flags, nonce, fsid) of a hello; ProtocolError on a
    wrong magic, unknown flags or nonzero reserved bytes."""
    if len(b) != HELLO_SIZE or b[:4] != MAGIC:
        raise ProtocolError("bad magic in the node's hello: not a tensorwire node")
    if b[5] & ~FLAG_TOKEN or b[6] or b[7] or any(b[56:64]):
        raise ProtocolError("reserved bits set in the node's hello")
    return b[4], b[5], bytes(b[8:40]), bytes(b[40:56])


def proof(token, label, client_hello, server_hello):
    """HMAC-SHA256(token, label || client hello || server hello)."""
    return hmac.new(token, label + client_hello + server_hello, hashlib.sha256).digest()


def status(code, message=""):
    """The server's verdict: 00, or a code, a uint16 length and a message."""
    if code == 0:
        return b"\x00"
    msg = message.encode("utf-8")[:MAX_STATUS_MSG]
    return bytes((code,)) + struct.pack(">H", len(msg)) + msg


def read_fsid(root, create=True):
    """The filesystem identity of a shared root: the 16 bytes in its
    .tensorwire-fsid (32 hex digits), created as the nodes create it if the
    root has none (a temporary file hard-linked into place: concurrent
    creators agree on one id); with create false, ZERO_FSID then (a
    client's: it writes nothing into the folder it is given)."""
    path = os.path.join(root, FSID_FILE)
    try:
        return _read_fsid_file(path)
    except FileNotFoundError:
        if not create:
            return ZERO_FSID
    new = os.urandom(16)
    fd, tmp = tempfile.mkstemp(prefix=FSID_FILE + ".tmp", dir=root)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(new.hex() + "\n")
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
    finally:
        os.unlink(tmp)
    return _read_fsid_file(path)


def _read_fsid_file(path):
    with open(path, "rb") as f:
        s = f.read().strip()
    try:
        b = bytes.fromhex(s.decode("ascii"))
    except (ValueError, UnicodeDecodeError):
        b = b""
    if len(b) != 16 or len(s) != 32 or b == ZERO_FSID:
        raise ValueError(f"fsid: {path} does not hold a 16-byte hex id")
    return b


def parse_session(b):
    """Returns (secret, max side connections) of a version 3 session message;
    ProtocolError on nonzero reserved bytes."""
    if len(b) != SESSION_MSG_SIZE:
        raise ProtocolError(f"session message of {len(b)} bytes")
    if any(b[34:40]):
        raise ProtocolError("reserved bytes set in the node's session message")
    return bytes(b[:32]), struct.unpack(">H", b[32:34])[0]


# Sharing (version 4): the where messages and the probe.

def boot_id():
    """The 16 bytes of this kernel's boot id (a UUID fresh at each boot, the
    same in every container of that kernel); zero where there is none."""
    try:
        with open(BOOT_ID_FILE, "rb") as f:
            s = f.read().strip().replace(b"-", b"")
        b = bytes.fromhex(s.decode("ascii"))
    except (OSError, ValueError, UnicodeDecodeError):
        return bytes(16)
    return b if len(b) == 16 else bytes(16)


def host_id(root):
    """(boot id, device, inode) of this side: its kernel's boot id and the
    device and inode numbers of root's .tensorwire-fsid (zero without a
    root, or where it cannot be read)."""
    boot = boot_id()
    if not root:
        return boot, 0, 0
    try:
        st = os.stat(os.path.join(root, FSID_FILE))
    except OSError:
        return boot, 0, 0
    return boot, st.st_dev & (1 << 64) - 1, st.st_ino & (1 << 64) - 1


def server_where(boot, dev, ino, probe):
    """A node's where message, 48 bytes: boot id, device, inode, probe name."""
    if len(boot) != 16 or len(probe) != 16:
        raise ValueError("a where message needs a 16-byte boot id and a 16-byte probe name")
    return bytes(boot) + struct.pack(">QQ", dev, ino) + bytes(probe)


def parse_server_where(b):
    """Returns (boot id, device, inode, probe name) of a node's where message."""
    if len(b) != SERVER_WHERE_SIZE:
        raise ProtocolError(f"where message of {len(b)} bytes")
    dev, ino = struct.unpack(">QQ", b[16:32])
    return bytes(b[:16]), dev, ino, bytes(b[32:48])


def client_where(boot, dev, ino, level):
    """A client's where message, 40 bytes: boot id, device, inode, the level
    decided ("none", "storage", "coherent") and 7 reserved bytes."""
    if len(boot) != 16:
        raise ValueError("a where message needs a 16-byte boot id")
    return bytes(boot) + struct.pack(">QQ", dev, ino) + bytes((LEVELS.index(level),)) + bytes(7)


def parse_client_where(b):
    """Returns (boot id, device, inode, level) of a client's where message;
    ProtocolError on a level above 2 or nonzero reserved bytes, as a node
    closes the connection on them."""
    if len(b) != CLIENT_WHERE_SIZE:
        raise ProtocolError(f"where message of {len(b)} bytes")
    if b[32] >= len(LEVELS) or any(b[33:40]):
        raise ProtocolError("reserved bits set in the where message")
    dev, ino = struct.unpack(">QQ", b[16:32])
    return bytes(b[:16]), dev, ino, LEVELS[b[32]]


def read_probe(root, name):
    """Whether root holds the probe file name (16 bytes) as a node makes it:
    .tensorwire-probe/<hex>, a regular file, empty."""
    if not root or name == bytes(16):
        return False
    try:
        st = os.lstat(os.path.join(root, PROBE_DIR, name.hex()))
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_size == 0


def decide_sharing(probed, node, client):
    """The level two sides share, and why, given whether the client read the
    node's probe through its own root and the two sides' (boot id, device,
    inode): docs/protocol.md's rule, as the node applies it too."""
    if not probed:
        return NONE, ("the client's root does not hold the node's probe file: not the node's root "
                      "(another folder, or a copy of it)")
    (nboot, ndev, nino), (cboot, cdev, cino) = node, client
    if nboot == bytes(16) or cboot == bytes(16):
        return STORAGE, ("the same files; a side cannot tell its kernel (no boot id), so mappings are "
                         "not assumed coherent")
    if nboot != cboot:
        return STORAGE, ("the same files from another machine (boot ids differ): another page cache, so "
                         "only write-once files go by reference")
    if ndev == 0 or ndev != cdev or nino != cino:
        return STORAGE, (f"the same files through another mount (device/inode {cdev}/{cino} here, "
                         f"{ndev}/{nino} at the node): another page cache, so only write-once files go "
                         "by reference")
    return COHERENT, "one kernel and one mount: one page cache"


# Message headers (docs/protocol.md, "Messages").

def request_header(method, timeout_us, arg_len, body_len, stream=False, uncompressed=False, raw_len=0):
    """A request header, length-prefixed, in the bytes Go writes (keys
    sorted, integers in their smallest signed form). stream, uncompressed
    and raw_len (the body is an LZ4 frame of that many bytes) are version
    2's keys, left out when false or 0."""
    h = (bytes((0x84 + stream + uncompressed + bool(raw_len),)) + _msgpack.pack_str("arg_len")
         + _msgpack.pack_int(arg_len) + _msgpack.pack_str("body_len") + _msgpack.pack_int(body_len)
         + _msgpack.pack_str("method") + _msgpack.pack_str(method))
    if raw_len:
        h += _msgpack.pack_str("raw_len") + _msgpack.pack_int(raw_len)
    if stream:
        h += _msgpack.pack_str("stream") + b"\xc3"
    h += _msgpack.pack_str("timeout_us") + _msgpack.pack_int(timeout_us)
    if uncompressed:
        h += _msgpack.pack_str("uncompressed") + b"\xc3"
    return struct.pack(">I", len(h)) + h


def stream_message_header(arg_len, body_len, raw_len=0):
    """A message frame's header of a message stream (version 2), length-prefixed;
    raw_len: the body is an LZ4 frame of that many bytes (as a node writes it)."""
    h = (bytes((0x82 + bool(raw_len),)) + _msgpack.pack_str("arg_len") + _msgpack.pack_int(arg_len)
         + _msgpack.pack_str("body_len") + _msgpack.pack_int(body_len))
    if raw_len:
        h += _msgpack.pack_str("raw_len") + _msgpack.pack_int(raw_len)
    return struct.pack(">I", len(h)) + h


def stream_end_header(code=0, message="", reason=""):
    """An end frame of a message stream (version 2), length-prefixed."""
    h = (bytes((0x84 if reason else 0x83,)) + _msgpack.pack_str("code") + _msgpack.pack_int(code)
         + _msgpack.pack_str("end") + b"\xc3" + _msgpack.pack_str("message") + _msgpack.pack_str(message))
    if reason:
        h += _msgpack.pack_str("reason") + _msgpack.pack_str(reason)
    return struct.pack(">I", len(h)) + h


def parse_stream_header(b):
    """Decodes a frame header of a message stream: a Response whose end
    attribute says whether it is an end frame (code, message, reason) or a
    message (arg_len, body_len)."""
    m = _header_map(b)
    r = _response(m)
    r.end = m.get("end", False) is True
    if r.end and (r.arg_len or r.body_len or r.raw_len):
        raise ProtocolError("a stream's end frame with a payload")
    if not r.end and ("code" in m or "message" in m or "reason" in m):
        raise ProtocolError("a stream's message frame with a code")
    return r


def response_header(code, message="", reason="", arg_len=0, body_len=0, raw_len=0):
    """A response header, length-prefixed, as a node writes it (raw_len: the
    body is an LZ4 frame of that many bytes)."""
    h = (bytes((0x84 + bool(reason) + bool(raw_len),)) + _msgpack.pack_str("arg_len") + _msgpack.pack_int(arg_len)
         + _msgpack.pack_str("body_len") + _msgpack.pack_int(body_len)
         + _msgpack.pack_str("code") + _msgpack.pack_int(code)
         + _msgpack.pack_str("message") + _msgpack.pack_str(message))
    if raw_len:
        h += _msgpack.pack_str("raw_len") + _msgpack.pack_int(raw_len)
    if reason:
        h += _msgpack.pack_str("reason") + _msgpack.pack_str(reason)
    return struct.pack(">I", len(h)) + h


class Response:
    """A decoded response header."""

    __slots__ = ("code", "message", "reason", "arg_len", "body_len", "raw_len", "end")

    def error(self):
        return from_wire(self.code, self.message, self.reason)


def parse_response_header(b):
    """Decodes a response header (without its length prefix). Any valid
    msgpack map is accepted, keys in any order; unknown keys are skipped."""
    return _response(_header_map(b))


def _header_map(b):
    """A header's bytes decoded: a dict, or ProtocolError."""
    try:
        m = _msgpack.unpackb(b)
    except Exception as e:  # msgpack's errors have no common base
        raise ProtocolError(f"response header: {e}") from None
    if not isinstance(m, dict):
        raise ProtocolError("response header: not a map")
    return m


def _response(m):
    """The Response of a decoded header map, checked."""
    r = Response()
    r.code, r.message, r.reason = m.get("code", 0), m.get("message", ""), m.get("reason", "")
    r.arg_len, r.body_len, r.raw_len = m.get("arg_len", 0), m.get("body_len", 0), m.get("raw_len", 0)
    r.end = False
    for k in ("code", "arg_len", "body_len", "raw_len"):
        v = getattr(r, k)
        if not isinstance(v, int) or isinstance(v, bool):
            raise ProtocolError(f"response header: {k} is {v!r}")
    if not 0 <= r.code <= 255:
        raise ProtocolError(f"response header: code {r.code}")
    for k in ("message", "reason"):
        v = getattr(r, k)
        if isinstance(v, bytes):
            setattr(r, k, v.decode("utf-8", "replace"))
        elif not isinstance(v, str):
            raise ProtocolError(f"response header: {k} is {v!r}")
    if not 0 <= r.arg_len <= MAX_ARG_BYTES:
        raise ProtocolError(f"response: argument of {r.arg_len} bytes (limit {MAX_ARG_BYTES})")
    if not 0 <= r.body_len <= MAX_BODY_BYTES:
        raise ProtocolError(f"response: body of {r.body_len} bytes (limit {MAX_BODY_BYTES})")
    # An LZ4 frame's claimed length, checked before anything is allocated
    # for it (docs/protocol.md, "Compression").
    if r.raw_len and not (r.raw_len <= MAX_BODY_BYTES and r.raw_len <= 255 * r.body_len + 1024):
        raise ProtocolError(f"response: an LZ4 frame of {r.body_len} bytes said to inflate to {r.raw_len} "
                            f"(limit {MAX_BODY_BYTES}, and no frame inflates past 255 times its size + 1 KiB)")
    if r.raw_len < 0:
        raise ProtocolError(f"response: raw_len {r.raw_len}")
    return r


def parse_request_header(b):
    """Decodes a request header (for tests and tools): a dict."""
    m = _msgpack.unpackb(b)
    if not isinstance(m, dict):
        raise ProtocolError("request header: not a map")
    return m


def refusal(code, message):
    """The exception for a handshake refusal."""
    e = from_wire(code, message)
    return e if isinstance(e, TensorwireError) else TensorwireError(message, code=code)
