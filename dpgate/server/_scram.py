"""SCRAM-SHA-256 (RFC 5802 with RFC 7677's hash), the server side, as PostgreSQL speaks it.

The server stores, per analyst, only a *verifier* — salt, iteration count,
``StoredKey = H(HMAC(SaltedPassword, "Client Key"))`` and
``ServerKey = HMAC(SaltedPassword, "Server Key")`` — in PostgreSQL's text form
``SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>`` (base64).  The
password never reaches the server: the client proves it knows ``ClientKey``
(whose hash is ``StoredKey``), and the server proves it knows ``ServerKey``.

Channel binding (``SCRAM-SHA-256-PLUS``) is not offered; a client that supports
it sends the ``y`` GS2 flag, which is accepted (RFC 5802 §6: it means the client
believes the server does not support binding, which is true here).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import stringprep
import unicodedata
from dataclasses import dataclass, field

from dpgate.errors import OperationalError

__all__ = ["MECHANISM", "Decoy", "ScramError", "Verifier", "ServerExchange", "make_verifier", "saslprep"]

MECHANISM = "SCRAM-SHA-256"
DEFAULT_ITERATIONS = 4096  # PostgreSQL's default (scram_iterations)


class ScramError(OperationalError):
    """The SCRAM exchange failed (malformed message or wrong password); the client sees 28P01."""


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str) -> bytes:
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError) as exc:
        raise ScramError(f"invalid base64 in a SCRAM message: {exc}") from None


def _hmac(key: bytes, msg: bytes) -> bytes:
    return hmac.new(key, msg, hashlib.sha256).digest()


def saslprep(password: str) -> str:
    """RFC 4013 SASLprep of a password, as libpq applies it; the raw text when it is not valid.

    libpq falls back to the raw password when SASLprep fails (prohibited or
    unassigned characters), so the server's verifier must do the same.
    """
    mapped = "".join(
        " " if stringprep.in_table_c12(c) else c for c in password if not stringprep.in_table_b1(c)
    )
    norm = unicodedata.normalize("NFKC", mapped)
    prohibited = (stringprep.in_table_c12, stringprep.in_table_c21_c22, stringprep.in_table_c3,
                  stringprep.in_table_c4, stringprep.in_table_c5, stringprep.in_table_c6,
                  stringprep.in_table_c7, stringprep.in_table_c8, stringprep.in_table_c9, stringprep.in_table_a1)
    if any(check(c) for c in norm for check in prohibited):
        return password
    return norm


@dataclass(frozen=True)
class Verifier:
    """What the server stores for one analyst: never the password."""

    iterations: int
    salt: bytes
    stored_key: bytes
    server_key: bytes

    def __str__(self) -> str:
        return (f"{MECHANISM}${self.iterations}:{_b64(self.salt)}"
                f"${_b64(self.stored_key)}:{_b64(self.server_key)}")

    @classmethod
    def parse(cls, text: str) -> Verifier:
        """Read PostgreSQL's verifier text ``SCRAM-SHA-256$<i>:<salt>$<StoredKey>:<ServerKey>``."""
        bad = ScramError(f"not a {MECHANISM} verifier: expected {MECHANISM}$<iterations>:<salt>$<key>:<key>")
        try:
            mech, params, keys = text.split("$")
            iterations, salt = params.split(":")
            stored, server = keys.split(":")
            rounds = int(iterations)
            verifier = cls(rounds, _unb64(salt), _unb64(stored), _unb64(server))
        except (ValueError, ScramError):
            raise bad from None
        if mech != MECHANISM or rounds < 1:
            raise bad
        return verifier


def make_verifier(password: str, *, iterations: int = DEFAULT_ITERATIONS, salt: bytes | None = None) -> Verifier:
    """Derive the verifier of ``password`` (random 16-byte salt unless given)."""
    salt = secrets.token_bytes(16) if salt is None else salt
    salted = hashlib.pbkdf2_hmac("sha256", saslprep(password).encode("utf-8"), salt, iterations)
    client_key = _hmac(salted, b"Client Key")
    return Verifier(iterations, salt, hashlib.sha256(client_key).digest(), _hmac(salted, b"Server Key"))


@dataclass(frozen=True)
class Decoy:
    """What an unknown name is shown, so that a probe cannot tell it from a known one: a salt
    derived from a server secret and the name (``HMAC-SHA256(secret, name)``, 16 bytes like a
    real one, the same on every attempt as a real user's) and the iteration count of the
    known users.

    Attributes:
        secret: the server's secret (kept out of every message).
        iterations: the known users' iteration count.
    """

    secret: bytes = field(repr=False)
    iterations: int = DEFAULT_ITERATIONS

    def salt(self, name: str) -> bytes:
        """The salt shown for the unknown ``name``."""
        return hmac.new(self.secret, b"dpgate scram decoy salt\x00" + name.encode("utf-8", "surrogatepass"),
                        hashlib.sha256).digest()[:16]


def _attributes(message: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in message.split(","):
        if len(part) < 2 or part[1] != "=":
            raise ScramError(f"malformed SCRAM attribute {part[:20]!r}")
        out.setdefault(part[0], part[2:])
    return out


class ServerExchange:
    """One SCRAM-SHA-256 exchange, driven by the client's two messages.

    ``verifier=None`` (an unknown analyst, ``name``) runs the same exchange on a
    made-up verifier and fails at the end, so a client cannot tell unknown names from
    wrong passwords: its salt and iteration count are the ``decoy``'s (the same for the
    same name on every attempt, like a real user's), its keys random.  Without a decoy
    the salt is random (it then changes between attempts, which a probe can notice).
    """

    def __init__(self, verifier: Verifier | None, *, nonce: str | None = None, name: str = "",
                 decoy: Decoy | None = None) -> None:
        self._fixed_nonce = nonce  # the server's nonce part: tests only (RFC 7677's example)
        self._known = verifier is not None
        if verifier is None:  # random keys that look like a real verifier
            salt = secrets.token_bytes(16) if decoy is None else decoy.salt(name)
            verifier = Verifier(DEFAULT_ITERATIONS if decoy is None else decoy.iterations, salt,
                                secrets.token_bytes(32), secrets.token_bytes(32))
        self._verifier = verifier
        self._client_first_bare = ""
        self._server_first = ""
        self._gs2 = ""
        self._nonce = ""

    def server_first(self, client_first: bytes) -> bytes:
        """Answer the client-first message (``n,,n=…,r=<client nonce>``)."""
        text = client_first.decode("utf-8", "strict")
        if not text or text[0] not in "ny":
            raise ScramError("the client asked for channel binding (p=…), which this server does not offer")
        parts = text.split(",", 2)
        if len(parts) != 3:
            raise ScramError("malformed SCRAM client-first message")
        self._gs2 = f"{parts[0]},{parts[1]},"
        self._client_first_bare = parts[2]
        attrs = _attributes(self._client_first_bare)
        if "r" not in attrs or not attrs["r"]:
            raise ScramError("the SCRAM client-first message has no nonce")
        self._nonce = attrs["r"] + (self._fixed_nonce or _b64(secrets.token_bytes(18)))
        v = self._verifier
        self._server_first = f"r={self._nonce},s={_b64(v.salt)},i={v.iterations}"
        return self._server_first.encode("ascii")

    def server_final(self, client_final: bytes) -> bytes:
        """Check the client's proof; return the server-final message (``v=…``).

        Raises:
            ScramError: wrong password, unknown analyst, or a malformed message.
        """
        text = client_final.decode("utf-8", "strict")
        without_proof, sep, proof_b64 = text.rpartition(",p=")
        if not sep:
            raise ScramError("the SCRAM client-final message has no proof")
        attrs = _attributes(without_proof)
        if attrs.get("r") != self._nonce:
            raise ScramError("the SCRAM nonce does not match")
        if _unb64(attrs.get("c", "")) != self._gs2.encode("utf-8"):
            raise ScramError("the SCRAM channel-binding data does not match the GS2 header")
        auth_message = f"{self._client_first_bare},{self._server_first},{without_proof}".encode()
        v = self._verifier
        proof = _unb64(proof_b64)
        signature = _hmac(v.stored_key, auth_message)
        if len(proof) != len(signature):
            raise ScramError("the SCRAM proof has the wrong length")
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        ok = hmac.compare_digest(hashlib.sha256(client_key).digest(), v.stored_key)
        if not (ok and self._known):
            raise ScramError("password authentication failed")
        return f"v={_b64(_hmac(v.server_key, auth_message))}".encode("ascii")
