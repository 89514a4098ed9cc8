"""Remove agent tokens, enrollment codes, renters' API tokens and tunnel access tokens from text
about to be logged.

Agents may still put their token in the URL (the legacy ``/api/p2p/ws/<token>`` path), and URLs
end up in access logs, error logs and tracebacks; a token in a log file is a leaked credential.
"""

from __future__ import annotations

import re

REDACTED = "[redacted]"

# "/" may arrive percent-encoded in a raw request line and the hub still routes it; no leading
# "/" is required because URL resolver errors quote the path without it.
_SLASH = r"(?:/|%2f)"
_LEGACY_WS_PATH = re.compile(rf"(api{_SLASH}p2p{_SLASH}ws{_SLASH})[^/?#\s\"']+", re.IGNORECASE)
# See hub/lib/tokens.py: "cgpu_" + 36 base62 characters; "_" may arrive as %5F.
_TOKEN = re.compile(r"cgpu(?:_|%5f)[0-9A-Za-z]{36}", re.IGNORECASE)
# See hub/accounts/api_tokens.py: renters' API tokens, "cgpr_" + 36 base62 characters.
_API_TOKEN = re.compile(r"cgpr(?:_|%5f)[0-9A-Za-z]{36}", re.IGNORECASE)
# See hub/installer/enrollment.py: install one-liners' codes, "cgpe_" + 36 base62 characters.
_ENROLLMENT_CODE = re.compile(r"cgpe(?:_|%5f)[0-9A-Za-z]{36}", re.IGNORECASE)
# See hub/tunnels/access.py: "cgpa_" + a signed value (base64url and ":" separators).
_ACCESS_TOKEN = re.compile(r"cgpa(?:_|%5f)[0-9A-Za-z_:%-]+", re.IGNORECASE)
_SECRET_QUERY_VALUE = re.compile(
    r"([?&;](?:token|access_token|key|code)=)[^&;#\s\"']*", re.IGNORECASE
)


def redact(text: str) -> str:
    """``text`` with every token-bearing path segment, token and secret query value hidden."""
    text = _LEGACY_WS_PATH.sub(rf"\g<1>{REDACTED}", text)
    text = _TOKEN.sub(f"cgpu_{REDACTED}", text)
    text = _API_TOKEN.sub(f"cgpr_{REDACTED}", text)
    text = _ENROLLMENT_CODE.sub(f"cgpe_{REDACTED}", text)
    text = _ACCESS_TOKEN.sub(f"cgpa_{REDACTED}", text)
    return _SECRET_QUERY_VALUE.sub(rf"\g<1>{REDACTED}", text)
