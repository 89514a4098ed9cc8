"""sshd's AuthorizedKeysCommand on the tunnel gateway: ask the hub which forwards a key may
open, and print its answer (an authorized_keys line, or nothing: no login).

Copied into the gateway's folder and run by /usr/bin/python3 as an unprivileged user, so it
uses the standard library only. Usage: keys_command.py CONFIG_JSON USER KEY_TYPE KEY_BASE64.
The hub's address and the gateway secret come from CONFIG_JSON, never from the command line.
"""

import json
import sys
import urllib.parse
import urllib.request

TIMEOUT_S = 5
MAX_ANSWER_BYTES = 64 * 1024


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None  # the secret header goes to the configured hub and nowhere else


def main(argv: list[str]) -> int:
    if len(argv) != 5:
        print("usage: keys_command.py CONFIG USER KEY_TYPE KEY", file=sys.stderr)
        return 2
    config_path, user, key_type, key = argv[1:]
    with open(config_path) as handle:
        config = json.load(handle)
    query = urllib.parse.urlencode({"user": user, "type": key_type, "key": key})
    if not config["hub_url"].startswith(("http://", "https://")):
        print("cloudgpu keys command: hub_url must be http(s)", file=sys.stderr)
        return 2
    request = urllib.request.Request(  # noqa: S310 - scheme checked above
        f"{config['hub_url'].rstrip('/')}/internal/tunnels/authorized-keys?{query}",
        headers={"X-CloudGPU-Gateway-Secret": config["secret"]},
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect)
    try:
        with opener.open(request, timeout=TIMEOUT_S) as response:
            answer = response.read(MAX_ANSWER_BYTES).decode("utf-8")
    except OSError as exc:  # URLError, HTTPError, timeouts: no answer means no login
        print(f"cloudgpu keys command: the hub did not answer: {exc}", file=sys.stderr)
        return 1
    sys.stdout.write(answer)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
