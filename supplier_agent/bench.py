"""``cloudgpu-agent bench``: load against an OpenAI-compatible endpoint (a rental's URL, or any
vLLM/TGI/llama.cpp server), closed loop (``--concurrency`` requests always in flight) or open
loop (``--rate`` new requests a second, whatever the server's pace), streaming every response
to time the first token and the gaps between tokens.

Standard library only (the agent installs with three dependencies): one thread per request in
flight, ``http.client`` for the streams.
"""

from __future__ import annotations

import http.client
import json
import random
import socket
import ssl
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import urlsplit

# Words for the random dataset; each is one token for common tokenizers, so a prompt of N
# words is close to N tokens (servers report the exact count in usage, which we show).
_WORDS = tuple(
    [
        "the",
        "of",
        "and",
        "to",
        "in",
        "is",
        "was",
        "for",
        "on",
        "that",
        "with",
        "as",
        "by",
        "at",
        "from",
        "his",
        "her",
        "which",
        "this",
        "are",
        "be",
        "have",
        "not",
        "were",
        "had",
        "it",
        "but",
        "they",
        "one",
        "all",
        "been",
        "their",
        "has",
        "more",
        "when",
        "who",
        "will",
        "would",
        "there",
        "time",
    ]
)
DATASETS = ("random",)


class BenchError(ValueError):
    """A setting that cannot work, said in words."""


@dataclass(frozen=True)
class BenchOptions:
    url: str
    model: str
    concurrency: int = 1
    isl: int = 128
    osl: int = 32
    dataset: str = "random"
    rate: float | None = None  # requests a second (open loop); None: closed loop
    requests: int = 32
    api_key: str = ""
    timeout_s: float = 600.0
    seed: int = 0
    # For the hub's worker (hub/benchmarks): extra request headers (the edge's access token),
    # a host:port to connect to instead of the URL's host (as curl --connect-to; the Host
    # header and TLS name stay the URL's), and a limit on the whole run: requests not sent
    # by then are counted as errors, and none waits past it.
    headers: tuple[tuple[str, str], ...] = ()
    connect_to: str = ""
    max_duration_s: float | None = None


class _ConnectToHTTPS(http.client.HTTPSConnection):
    """HTTPS to ``address`` with the URL's host name for SNI and the certificate check."""

    def __init__(self, host: str, address: tuple[str, int], **kwargs: Any) -> None:
        super().__init__(host, **kwargs)
        self._address = address

    def connect(self) -> None:
        sock = socket.create_connection(self._address, self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)  # type: ignore[attr-defined]


class _ConnectToHTTP(http.client.HTTPConnection):
    def __init__(self, host: str, address: tuple[str, int], **kwargs: Any) -> None:
        super().__init__(host, **kwargs)
        self._address = address

    def connect(self) -> None:
        self.sock = socket.create_connection(self._address, self.timeout)


def _address(connect_to: str) -> tuple[str, int]:
    host, sep, port = connect_to.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise BenchError(f"connect_to must be host:port, not {connect_to!r}")
    return host.strip("[]"), int(port)


@dataclass
class RequestResult:
    ok: bool
    output_tokens: int = 0
    ttft_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    latency_s: float = 0.0
    error: str = ""


def completions_url(url: str) -> str:
    """The completions endpoint under a base URL as people paste it (with or without /v1)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise BenchError(f"--url must look like http://host:8000, not {url!r}")
    path = parts.path.rstrip("/")
    if path.endswith("/completions"):
        pass
    elif path.endswith("/v1"):
        path += "/completions"
    else:
        path += "/v1/completions"
    return f"{parts.scheme}://{parts.netloc}{path}"


def _prompt(rng: random.Random, isl: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(isl))


def _one(
    options: BenchOptions,
    endpoint: str,
    prompt: str,
    timeout_s: float | None = None,
    deadline: float | None = None,
) -> RequestResult:
    parts = urlsplit(endpoint)
    timeout = options.timeout_s if timeout_s is None else timeout_s
    connection: http.client.HTTPConnection
    if options.connect_to and parts.scheme == "https":
        connection = _ConnectToHTTPS(
            parts.netloc,
            _address(options.connect_to),
            timeout=timeout,
            context=ssl.create_default_context(),
        )
    elif options.connect_to:
        connection = _ConnectToHTTP(parts.netloc, _address(options.connect_to), timeout=timeout)
    elif parts.scheme == "https":
        connection = http.client.HTTPSConnection(
            parts.netloc, timeout=timeout, context=ssl.create_default_context()
        )
    else:
        connection = http.client.HTTPConnection(parts.netloc, timeout=timeout)
    body = {
        "model": options.model,
        "prompt": prompt,
        "max_tokens": options.osl,
        "stream": True,
        "stream_options": {"include_usage": True},
        # vLLM and SGLang: generate exactly osl tokens, as benchmarks of a fixed shape need;
        # servers that do not know it ignore it.
        "ignore_eos": True,
    }
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    headers.update(options.headers)
    if options.api_key:
        headers["Authorization"] = f"Bearer {options.api_key}"
    started = time.perf_counter()
    result = RequestResult(ok=False)
    try:
        connection.request("POST", parts.path, json.dumps(body), headers)
        response = connection.getresponse()
        if response.status != 200:
            text = response.read(300).decode("utf-8", "replace").strip()
            result.error = f"HTTP {response.status}: {text}"
            return result
        last: float | None = None
        chunks = 0
        usage_tokens: int | None = None
        while True:
            if deadline is not None:
                # The socket's timeout bounds each wait, not the whole stream: a server that
                # drips a token just inside it would hold the run past its limit.
                left = deadline - time.perf_counter()
                if left <= 0:
                    result.error = "cut: the run's time limit passed"
                    return result
                if connection.sock is not None:
                    connection.sock.settimeout(min(timeout, left))
            line = response.readline()
            if not line:
                break
            text = line.decode("utf-8", "replace").strip()
            if not text.startswith("data:"):
                continue
            data = text.removeprefix("data:").strip()
            if data == "[DONE]":
                break
            event = json.loads(data)
            if event.get("usage") and event["usage"].get("completion_tokens") is not None:
                usage_tokens = int(event["usage"]["completion_tokens"])
            if not any(c.get("text") for c in event.get("choices") or ()):
                continue
            now = time.perf_counter()
            if last is None:
                result.ttft_s = now - started
            else:
                result.itl_s.append(now - last)
            last = now
            chunks += 1
        result.output_tokens = usage_tokens if usage_tokens is not None else chunks
        result.ok = chunks > 0
        if not result.ok:
            result.error = "the stream ended without a token"
    except (OSError, http.client.HTTPException, json.JSONDecodeError, ValueError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    finally:
        result.latency_s = time.perf_counter() - started
        connection.close()
    return result


def _percentile(values: list[float], pct: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    rank = min(len(ordered) - 1, max(0, round(pct / 100 * (len(ordered) - 1))))
    return ordered[rank]


def run_bench(
    options: BenchOptions, sleep: Callable[[float], None] = time.sleep
) -> dict[str, object]:
    """Run the load and return the summary (what ``--json`` prints)."""
    if options.dataset not in DATASETS:
        raise BenchError(f"--dataset must be one of {', '.join(DATASETS)}")
    if options.concurrency < 1 or options.isl < 1 or options.osl < 1 or options.requests < 1:
        raise BenchError("--concurrency, --isl, --osl and --requests must be at least 1")
    if options.rate is not None and options.rate <= 0:
        raise BenchError("--rate must be above 0 requests a second")
    if options.max_duration_s is not None and options.max_duration_s <= 0:
        raise BenchError("the run's time limit must be above 0 s")
    if options.connect_to:
        _address(options.connect_to)
    endpoint = completions_url(options.url)
    rng = random.Random(options.seed)  # noqa: S311 - prompts, not secrets; seeded to repeat
    prompts = [_prompt(rng, options.isl) for _ in range(options.requests)]
    results: list[RequestResult] = []
    lock = threading.Lock()

    started = time.perf_counter()
    ends_at = None if options.max_duration_s is None else started + options.max_duration_s

    def send(prompt: str) -> None:
        left = None if ends_at is None else ends_at - time.perf_counter()
        if left is not None and left <= 0:
            outcome = RequestResult(ok=False, error="not sent: the run's time limit passed")
        else:
            timeout = options.timeout_s if left is None else min(options.timeout_s, left)
            outcome = _one(options, endpoint, prompt, timeout, ends_at)
        with lock:
            results.append(outcome)

    if options.rate is None:
        with ThreadPoolExecutor(options.concurrency) as pool:
            list(pool.map(send, prompts))
    else:
        # Open loop: the schedule, not the answers, decides when each request leaves; a slow
        # server builds a queue, which is what open-loop load is for.
        with ThreadPoolExecutor(options.requests) as pool:
            for n, prompt in enumerate(prompts):
                delay = started + n / options.rate - time.perf_counter()
                if ends_at is not None:
                    delay = min(delay, ends_at - time.perf_counter())
                if delay > 0:
                    sleep(delay)
                pool.submit(send, prompt)
    duration = time.perf_counter() - started
    ok = [r for r in results if r.ok]
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    itls = [gap for r in ok for gap in r.itl_s]
    tokens = sum(r.output_tokens for r in ok)

    def ms(value: float | None) -> float | None:
        return None if value is None else round(value * 1000, 3)

    errors = [r.error for r in results if not r.ok]
    return {
        "url": endpoint,
        "model": options.model,
        "mode": "open loop" if options.rate is not None else "closed loop",
        "settings": {
            k: v
            for k, v in asdict(options).items()
            if k not in ("api_key", "url", "headers", "connect_to")
        },
        "requests": len(results),
        "ok": len(ok),
        "errors": len(errors),
        "error_examples": sorted(set(errors))[:3],
        "duration_s": round(duration, 3),
        "requests_per_s": round(len(ok) / duration, 3) if duration else None,
        "output_tokens": tokens,
        "output_tokens_per_s": round(tokens / duration, 3) if duration else None,
        "ttft_ms": {"p50": ms(_percentile(ttfts, 50)), "p99": ms(_percentile(ttfts, 99))},
        "itl_ms": {"p50": ms(_percentile(itls, 50)), "p99": ms(_percentile(itls, 99))},
    }


def format_table(summary: dict[str, object]) -> str:
    ttft = summary["ttft_ms"]
    itl = summary["itl_ms"]
    assert isinstance(ttft, dict)
    assert isinstance(itl, dict)

    def shown(value: object) -> str:
        return "-" if value is None else str(value)

    rows = [
        ("endpoint", f"{summary['url']} ({summary['model']}, {summary['mode']})"),
        ("requests", f"{summary['ok']} ok, {summary['errors']} failed"),
        ("duration", f"{summary['duration_s']} s"),
        ("requests/s", shown(summary["requests_per_s"])),
        ("output tokens/s", shown(summary["output_tokens_per_s"])),
        ("TTFT p50 / p99", f"{shown(ttft['p50'])} / {shown(ttft['p99'])} ms"),
        ("ITL p50 / p99", f"{shown(itl['p50'])} / {shown(itl['p99'])} ms"),
    ]
    examples = summary["error_examples"]
    assert isinstance(examples, list)
    rows.extend(("error", str(e)) for e in examples)
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)
