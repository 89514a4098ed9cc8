"""Loaded with ``-p tests.xdist_worker_env`` (pyproject's addopts), before pytest-django reads the
hub's settings: under pytest-xdist each worker process gets Redis keys of its own.

The workers share one Redis server (the developer's, or the embedded one of `make test`), and
the hubs each worker starts (tests/support/hub_stack.py) inherit this environment: without their
own REDIS_KEY_PREFIX, one worker's Celery worker would take another's tasks, and one worker's
channel layer would deliver to another's agents. The prefix is the hub's own setting for two
hubs on one Redis (tests/hub/test_shared_redis.py); each worker's database is pytest-django's
own (test_<name>_gw0, ...)."""

from __future__ import annotations

import os

_worker = os.environ.get("PYTEST_XDIST_WORKER", "")
if _worker:
    os.environ["REDIS_KEY_PREFIX"] = f"{os.environ.get('REDIS_KEY_PREFIX', 'cloudgpu')}-{_worker}"
