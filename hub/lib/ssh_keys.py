"""OpenSSH public key lines (``ssh-ed25519 AAAA... comment``), read and checked without Django.

Renters paste these; the gateway's sshd and the containers' sshd trust them. So the blob is
decoded and its inner type and sizes are checked here: a line that merely looks like a key
(a truncated paste, an RSA key too short to be safe) is refused with a sentence, not saved to
fail later in somebody's sshd log.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import struct
from dataclasses import dataclass

RSA_MIN_BITS = 2048
ECDSA_CURVES = {
    "ecdsa-sha2-nistp256": b"nistp256",
    "ecdsa-sha2-nistp384": b"nistp384",
    "ecdsa-sha2-nistp521": b"nistp521",
}
KEY_TYPES = ("ssh-ed25519", *ECDSA_CURVES, "ssh-rsa")
MAX_LINE = 8192  # an RSA 16384-bit key is ~2,800 characters; anything longer is not one key
MAX_COMMENT = 100


class BadPublicKey(ValueError):
    """The line is not an acceptable public key; the message says why, for the person."""


@dataclass(frozen=True)
class PublicKey:
    key_type: str
    blob: str  # base64, as in the line
    comment: str

    @property
    def line(self) -> str:
        """The key as authorized_keys takes it, comment kept."""
        return f"{self.key_type} {self.blob} {self.comment}".rstrip()

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.blob)


def fingerprint(blob_b64: str) -> str:
    """OpenSSH's SHA256 fingerprint of a base64 key blob, as ``ssh-keygen -l`` and sshd print it.
    Raises ValueError (binascii.Error) for a blob that is not base64."""
    blob = base64.b64decode(blob_b64, validate=True)
    digest = base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")
    return f"SHA256:{digest}"


def _strings(blob: bytes) -> list[bytes]:
    """The blob's SSH wire strings (uint32 length, bytes), all of them, or BadPublicKey."""
    found = []
    offset = 0
    while offset < len(blob):
        if offset + 4 > len(blob):
            raise BadPublicKey("the key is cut short (an incomplete paste?)")
        (length,) = struct.unpack(">I", blob[offset : offset + 4])
        offset += 4
        if offset + length > len(blob):
            raise BadPublicKey("the key is cut short (an incomplete paste?)")
        found.append(blob[offset : offset + length])
        offset += length
    return found


def _mpint_bits(value: bytes) -> int:
    return int.from_bytes(value, "big").bit_length()


def parse_public_key(text: str) -> PublicKey:
    """One OpenSSH public key line -> PublicKey, or BadPublicKey naming what is wrong."""
    line = text.strip()
    if not line:
        raise BadPublicKey("paste a public key, e.g. the line in ~/.ssh/id_ed25519.pub")
    if len(line) > MAX_LINE:
        raise BadPublicKey("that is longer than any one public key")
    if "\n" in line or "\r" in line:
        raise BadPublicKey("paste one key at a time (one line)")
    if "PRIVATE KEY" in line:
        raise BadPublicKey("that is a private key: paste the .pub file, and keep the private one")
    parts = line.split(None, 2)
    if len(parts) < 2:
        raise BadPublicKey("a public key line is '<type> <base64> [comment]'")
    key_type, blob_b64 = parts[0], parts[1]
    comment = parts[2].strip() if len(parts) == 3 else ""
    if key_type not in KEY_TYPES:
        raise BadPublicKey(
            f"key type {key_type[:40]!r} is not accepted: use ssh-ed25519, ecdsa-sha2-nistp256/"
            "384/521 or ssh-rsa of 2048 bits or more"
        )
    try:
        blob = base64.b64decode(blob_b64, validate=True)
    except (binascii.Error, ValueError):
        raise BadPublicKey("the key's middle part is not valid base64") from None
    fields = _strings(blob)
    if not fields or fields[0] != key_type.encode():
        raise BadPublicKey(f"the key's data is not a {key_type} key")
    if key_type == "ssh-ed25519":
        if len(fields) != 2 or len(fields[1]) != 32:
            raise BadPublicKey("the ssh-ed25519 key's data has the wrong size")
    elif key_type in ECDSA_CURVES:
        if len(fields) != 3 or fields[1] != ECDSA_CURVES[key_type] or not fields[2]:
            raise BadPublicKey(f"the {key_type} key's data does not match its curve")
    else:  # ssh-rsa: exponent, modulus
        if len(fields) != 3:
            raise BadPublicKey("the ssh-rsa key's data is malformed")
        bits = _mpint_bits(fields[2])
        if bits < RSA_MIN_BITS:
            raise BadPublicKey(
                f"this RSA key has {bits} bits; at least {RSA_MIN_BITS} are needed "
                "(or use ssh-keygen -t ed25519)"
            )
    if len(comment) > MAX_COMMENT:
        raise BadPublicKey(f"the key's comment is longer than {MAX_COMMENT} characters")
    # The comment lands in authorized_keys files: printable ASCII only, nothing that could
    # start another line or option there.
    if any(not (" " <= ch <= "~") for ch in comment):
        raise BadPublicKey("the key's comment may hold printable ASCII characters only")
    return PublicKey(key_type, blob_b64, comment)
