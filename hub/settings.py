"""The hub's one settings module, driven by the environment (see .env.example).

Production-safe by default: DEBUG is off unless asked for, a real SECRET_KEY is required
without DEBUG, and HTTPS hardening follows from an ``https://`` HUB_PUBLIC_URL.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from urllib.parse import urlsplit

from django.core.exceptions import ImproperlyConfigured

from hub.lib import csp, disk_allowance
from hub.lib.env import (
    EnvError,
    database_from_url,
    env_bool,
    env_int,
    env_list,
    env_secret,
    env_str,
)

BASE_DIR = Path(__file__).resolve().parent.parent

# Only ever good enough for DEBUG on a laptop; refused below otherwise.
_DEV_SECRET_KEY = "dev-insecure-cloudgpu-secret-key-do-not-use-in-production"  # noqa: S105

try:
    DEBUG = env_bool("DEBUG", False)
    SECRET_KEY = env_secret("SECRET_KEY", _DEV_SECRET_KEY)
    HUB_PUBLIC_URL = env_str("HUB_PUBLIC_URL", "http://127.0.0.1:8000").rstrip("/")
    _database_url = env_secret("DATABASE_URL")
    REDIS_URL = env_secret("REDIS_URL")
    if not _database_url:
        raise EnvError(
            "DATABASE_URL is not set. `make run` starts an embedded Postgres and sets it for you; "
            "elsewhere set DATABASE_URL=postgres://user:password@host:5432/dbname"
        )
    if not REDIS_URL:
        raise EnvError(
            "REDIS_URL is not set. `make run` starts an embedded Redis and sets it for you; "
            "elsewhere set REDIS_URL=redis://host:6379/0"
        )
    DATABASES = {"default": database_from_url(_database_url)}
    # Each process borrows connections from a pool of its own (psycopg_pool through Django's
    # OPTIONS["pool"]) and gives them back when a request, socket message or task ends.
    # Persistent per-thread connections (CONN_MAX_AGE) leaked under Daphne, which runs each
    # request on a thread of its own: a few hundred ordinary GETs used up Postgres'
    # max_connections and the hub stopped answering (issue 16). docs/operators.md: "Postgres
    # connections".
    if env_str("DATABASE_CONN_MAX_AGE") not in {"", "0"}:
        raise EnvError(
            "DATABASE_CONN_MAX_AGE is no longer supported: persistent connections leaked under "
            "Daphne. Connections are pooled per process; size the pool with "
            "DATABASE_POOL_MAX_SIZE (0 turns pooling off, e.g. behind PgBouncer)"
        )
    DATABASE_POOL_MAX_SIZE = env_int("DATABASE_POOL_MAX_SIZE", 16)
    DATABASE_POOL_MIN_SIZE = min(env_int("DATABASE_POOL_MIN_SIZE", 1), DATABASE_POOL_MAX_SIZE)
    # How long a request waits for a free connection before it is answered 503.
    DATABASE_POOL_TIMEOUT_S = env_int("DATABASE_POOL_TIMEOUT_S", 10)
    if DATABASE_POOL_MAX_SIZE < 0 or DATABASE_POOL_MIN_SIZE < 0 or DATABASE_POOL_TIMEOUT_S < 1:
        raise EnvError(
            "DATABASE_POOL_MAX_SIZE and DATABASE_POOL_MIN_SIZE must be 0 or more, "
            "DATABASE_POOL_TIMEOUT_S at least 1"
        )
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    # A connection is checked each time it is lent, so one that a Postgres restart broke is
    # replaced instead of failing a request. With the pool, the pool's check: hub.lib.db_pool
    # (put on the pool by hub.accounts' ready()) skips its empty query's round trip for a
    # connection lent within the last 2 s whose socket has nothing unread (a reconnect storm
    # paid one per token check and per registration batch; docs/benchmarks.md, issue 18).
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
    if DATABASE_POOL_MAX_SIZE:
        DATABASES["default"]["OPTIONS"]["pool"] = {
            "min_size": DATABASE_POOL_MIN_SIZE,
            "max_size": DATABASE_POOL_MAX_SIZE,
            "timeout": float(DATABASE_POOL_TIMEOUT_S),
            # The pool closes one connection above min_size per period in which it was never
            # needed: after a burst, a full pool is back to min_size within about 2.5 minutes.
            "max_idle": 10.0,
            "name": "cloudgpu",
        }
except EnvError as exc:
    raise ImproperlyConfigured(str(exc)) from None

# 50, as the message says and as Django's own deploy check (security.W009) wants.
MIN_SECRET_KEY_LENGTH = 50
if not DEBUG and (SECRET_KEY == _DEV_SECRET_KEY or len(SECRET_KEY) < MIN_SECRET_KEY_LENGTH):
    raise ImproperlyConfigured(
        "SECRET_KEY (or SECRET_KEY_FILE) must be set to a random string of 50+ characters "
        "when DEBUG is off; generate one with: "
        "python -c 'import secrets; print(secrets.token_urlsafe(50))'"
    )

_public = urlsplit(HUB_PUBLIC_URL)
if _public.scheme not in {"http", "https"} or not _public.hostname:
    raise ImproperlyConfigured(
        f"HUB_PUBLIC_URL must look like https://hub.example.com, not {HUB_PUBLIC_URL!r}"
    )
PUBLIC_HTTPS = _public.scheme == "https"

# "web" is the hub's name on docker compose's network: the tunnel gateway reaches it there.
ALLOWED_HOSTS = env_list(
    "ALLOWED_HOSTS", [_public.hostname, "localhost", "127.0.0.1", "[::1]", "web"]
)
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [f"{_public.scheme}://{_public.netloc}"])
# The live socket's Origin must be one of these exactly (scheme, host and port). On a loopback
# hub (make run) the loopback names are one machine: http://localhost:8000 is the same page.
LIVE_SOCKET_ORIGINS = [HUB_PUBLIC_URL, *CSRF_TRUSTED_ORIGINS]
if _public.hostname in {"127.0.0.1", "localhost", "::1"}:
    _port = f":{_public.port}" if _public.port else ""
    LIVE_SOCKET_ORIGINS += [
        f"{_public.scheme}://{name}{_port}" for name in ("127.0.0.1", "localhost", "[::1]")
    ]

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "hub.accounts",
    "hub.health",
    "hub.suppliers",
    "hub.leases",
    "hub.installer",
    "hub.tunnels",
    "hub.billing",
    "hub.catalog",
    "hub.volumes",
    "hub.benchmarks",
    "hub.notifications",
    "hub.rollouts",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "hub.api",
    "hub.fleet",
    "hub.agents",
    "hub.web",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "hub.lib.csp.ContentSecurityPolicyMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "hub.api.middleware.ApiBodyLimitMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "hub.urls"
CSRF_FAILURE_VIEW = "hub.health.views.csrf_failure"
ASGI_APPLICATION = "hub.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "hub.web.context.dashboard",
            ],
        },
    },
]

AUTH_USER_MODEL = "accounts.User"
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "/static/"
# Set where a collectstatic step runs (the container image); without one (make run, tests)
# WhiteNoise serves straight from the apps' static folders.
STATIC_ROOT = env_str("STATIC_ROOT") or None
WHITENOISE_USE_FINDERS = DEBUG or STATIC_ROOT is None
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- REST API (hub/api): renters' cgpr_ tokens, or the session for the browsable API ---------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        # First, so that a request without credentials gets 401 with WWW-Authenticate: Bearer.
        "hub.api.authentication.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    # HasScope: each view names the token scope each method needs; undeclared means refused.
    "DEFAULT_PERMISSION_CLASSES": [
        "rest_framework.permissions.IsAuthenticated",
        "hub.api.permissions.HasScope",
    ],
    "DEFAULT_PARSER_CLASSES": ["hub.api.parsers.BoundedJSONParser"],
    "DEFAULT_SCHEMA_CLASS": "hub.api.schema.ScopedAutoSchema",
    "EXCEPTION_HANDLER": "hub.api.exceptions.handle",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "CloudGPU API",
    "DESCRIPTION": (
        "Rent GPUs from a script. Authenticate with `Authorization: Bearer cgpr_...` (create a "
        "token on the dashboard's API tokens page, or at `/api/v1/tokens/`). A token has "
        "scopes: `read` (every GET but the token list), `leases` (start and stop leases, their "
        "access tokens) and `tokens` (list, create and revoke API tokens); new tokens get "
        "`read` and `leases`. "
        "Each operation names the scope it needs in `x-required-scope`; a token without it "
        "gets 403. A logged-in session has every scope. Money is integer micro-units "
        "(1 unit = 1,000,000 micros) next to a formatted string."
    ),
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    # The docs page's assets come from the sidecar package: nothing loads from a CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    "ENUM_NAME_OVERRIDES": {
        "LeaseStateEnum": "hub.leases.models.Lease.State",
        "EndReasonEnum": "hub.leases.models.Lease.EndReason",
        "TunnelStateEnum": "hub.tunnels.models.Tunnel.State",
        "LedgerKindEnum": "hub.billing.models.LedgerEntry.Kind",
        "ApiScopeEnum": "hub.accounts.models.ApiScope",
    },
}

# API request bodies (JSON) larger than this are answered 413 before they are read; other
# requests keep Django's own DATA_UPLOAD_MAX_MEMORY_SIZE (2.5 MB).
API_MAX_BODY_BYTES = env_int("API_MAX_BODY_BYTES", 256 * 1024)

# --- HTTPS hardening: follows the public URL, each knob overridable ----------------------------
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", PUBLIC_HTTPS)
SESSION_COOKIE_SECURE = PUBLIC_HTTPS
CSRF_COOKIE_SECURE = PUBLIC_HTTPS
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 31_536_000 if PUBLIC_HTTPS else 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", PUBLIC_HTTPS)
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", PUBLIC_HTTPS)
if env_bool("TRUST_X_FORWARDED_PROTO", False):
    # Only behind a proxy that overwrites this header; otherwise clients could forge it.
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"
# Scripts from the hub's own static files only (no inline script, no eval): hub/lib/csp.py.
CONTENT_SECURITY_POLICY = env_str("CONTENT_SECURITY_POLICY", csp.DEFAULT_POLICY)

# --- Channels and Celery share one Redis; Redis holds nothing that cannot be lost -------------
# The start of every Redis key the hub, its channel layer, its cache and Celery's broker write,
# so that two hubs can share one Redis (hub/lib/redis_keys.py).
REDIS_KEY_PREFIX = env_str("REDIS_KEY_PREFIX", "cloudgpu")
CHANNEL_LAYERS = {
    "default": {
        # channels_redis's, with a receive that waits out a Redis outage (hub/lib/channel_layer.py).
        "BACKEND": "hub.lib.channel_layer.ResilientRedisChannelLayer",
        "CONFIG": {
            "hosts": [REDIS_URL],
            "prefix": env_str("CHANNELS_PREFIX", REDIS_KEY_PREFIX),
            # Its pool per process (per event loop): at most this many connections, waited for
            # beyond that. The hub's own Redis commands and the cache share it
            # (hub/lib/shared_redis.py): a process holds at most 2 (docs/scaling.md).
            "max_connections": env_int("REDIS_POOL_MAX_CONNECTIONS", 2),
        },
    },
}

CELERY_BROKER_URL = REDIS_URL
CELERY_RESULT_BACKEND = REDIS_URL
CELERY_RESULT_EXPIRES = 3600
# Nothing reads the control plane's task results (the health probe opts back in): storing them
# cost a Redis write and a connection per worker for nothing.
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# A task that is not acked within this window is redelivered; no countdown may exceed it.
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": env_int("CELERY_VISIBILITY_TIMEOUT", 3600),
    # Queues, unacked sets and bindings under the hub's prefix too (kombu's Redis transport).
    "global_keyprefix": f"{REDIS_KEY_PREFIX}:celery:",
}
# Redis connections (issue 18, docs/scaling.md): a process that queues a task opens a broker
# connection for it and closes it after (~1.5 ms more per task queued), instead of keeping a
# pool of them (one per thread that ever queued one: the web process's views and database
# threads). A positive number keeps up to that many open per process.
CELERY_BROKER_POOL_LIMIT = env_int("CELERY_BROKER_POOL_LIMIT", 0)
# No remote control (`celery inspect`, `celery control`): nothing in the hub uses it, and its
# mailbox held two Redis connections in the worker. The worker's health check is its alive
# file instead (hub/celery.py, docker-compose.yml).
CELERY_WORKER_ENABLE_REMOTE_CONTROL = False
# A pool child whose resident memory passed this (KiB) after a task is replaced by a fresh one
# once the task is done (Celery's own bound, nothing cut short). The children start near
# 105 MiB and grew up to ~0.5 MiB an hour in the soaks (docs/benchmarks.md, issue 23): this
# keeps a worker that runs for months bounded whatever it is that grows. 0 turns it off.
_max_child_kib = env_int("CELERY_WORKER_MAX_MEMORY_PER_CHILD_KIB", 256 * 1024)
if _max_child_kib < 0:
    raise ImproperlyConfigured("CELERY_WORKER_MAX_MEMORY_PER_CHILD_KIB must be 0 (off) or more")
CELERY_WORKER_MAX_MEMORY_PER_CHILD = _max_child_kib or None
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TIMEZONE = "UTC"

# plain: one line of text per record; json: one JSON object per line with host, lease and
# command ids as fields, tokens redacted (hub/lib/logjson.py). The agent reads the same variable.
LOG_FORMAT = env_str("LOG_FORMAT", "plain").strip().lower() or "plain"
if LOG_FORMAT not in {"plain", "json"}:
    raise ImproperlyConfigured(f"LOG_FORMAT must be plain or json, not {LOG_FORMAT!r}")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"},
        "json": {"()": "hub.lib.logjson.HubJsonFormatter"},
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": LOG_FORMAT}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    # The pool logs each connection it closes for being idle at INFO: routine, not news.
    "loggers": {"psycopg.pool": {"level": "WARNING"}},
}

# --- Control plane ----------------------------------------------------------------------------
AGENT_HEARTBEAT_INTERVAL_S = env_int("AGENT_HEARTBEAT_INTERVAL_S", 15)
# An agent socket must send `register` this soon after connecting.
AGENT_REGISTER_TIMEOUT_S = env_int("AGENT_REGISTER_TIMEOUT_S", 30)
# The hub times a ping to each agent (the round trip on offers): first this long after it
# registers (with its next heartbeat), plus a random share of AGENT_RTT_FIRST_PING_SPREAD_S,
# then every AGENT_RTT_PING_INTERVAL_S. The spread: after a restart the whole fleet registers
# within a minute, and 10,000 first pongs at once were 10,000 row writes at once
# (docs/benchmarks.md, issue 15 fourth session).
AGENT_RTT_FIRST_PING_S = env_int("AGENT_RTT_FIRST_PING_S", 30)
AGENT_RTT_FIRST_PING_SPREAD_S = env_int("AGENT_RTT_FIRST_PING_SPREAD_S", 270)
AGENT_RTT_PING_INTERVAL_S = env_int("AGENT_RTT_PING_INTERVAL_S", 300)
# Hosts one agent token may hold: a leaked token cannot fill the fleet with made-up hosts.
MAX_HOSTS_PER_TOKEN = env_int("MAX_HOSTS_PER_TOKEN", 256)
# An install one-liner's enrollment code is exchangeable (once) for this long after it is made.
ENROLLMENT_CODE_TTL_S = env_int("ENROLLMENT_CODE_TTL_S", 3600)
# Failed code exchanges allowed per client address in ENROLLMENT_RATE_WINDOW_S (then 429).
ENROLLMENT_RATE_LIMIT = env_int("ENROLLMENT_RATE_LIMIT", 10)
ENROLLMENT_RATE_WINDOW_S = env_int("ENROLLMENT_RATE_WINDOW_S", 900)
if min(ENROLLMENT_CODE_TTL_S, ENROLLMENT_RATE_LIMIT, ENROLLMENT_RATE_WINDOW_S) < 1:
    raise ImproperlyConfigured(
        "ENROLLMENT_CODE_TTL_S, ENROLLMENT_RATE_LIMIT and ENROLLMENT_RATE_WINDOW_S "
        "must be at least 1"
    )
# Threads (each with a database connection) a web process gives its agent sockets' queries.
AGENT_DB_THREADS = env_int("AGENT_DB_THREADS", 4)
# A web process remembers agent tokens it accepted for this long, so a new socket's connect-time
# check skips its query (register re-checks the token: hub/agents/token_cache.py). 0: off.
AGENT_TOKEN_CACHE_S = env_int("AGENT_TOKEN_CACHE_S", 60)
if AGENT_TOKEN_CACHE_S < 0:
    raise ImproperlyConfigured("AGENT_TOKEN_CACHE_S must be 0 or more")
# A host is offline this long after its last heartbeat.
HOST_OFFLINE_AFTER_S = env_int("HOST_OFFLINE_AFTER_S", 45)
# Full GPU telemetry is written to Postgres on change, or at least this often; liveness itself
# goes to Redis on every heartbeat (Kubernetes' node-lease pattern).
HOST_STATS_WRITE_INTERVAL_S = env_int("HOST_STATS_WRITE_INTERVAL_S", 60)
# That telemetry waits in Redis and is written to Postgres this often, many hosts per statement.
HOST_STATS_FLUSH_INTERVAL_S = env_int("HOST_STATS_FLUSH_INTERVAL_S", 2)
# Leases on an offline host wait this long for it to come back before ending with host_lost.
LEASE_HOST_GRACE_S = env_int("LEASE_HOST_GRACE_S", 600)
# Unacked commands are re-sent this often until their deadline.
COMMAND_RESEND_S = env_int("COMMAND_RESEND_S", 10)
COMMAND_DEADLINES_S = {
    "reserve": env_int("COMMAND_DEADLINE_RESERVE_S", 120),
    # Pulling a large image can take a while; the agent acks only once the ports answer.
    "docker_run": env_int("COMMAND_DEADLINE_DOCKER_RUN_S", 1800),
    "release": env_int("COMMAND_DEADLINE_RELEASE_S", 600),
}
SWEEP_INTERVAL_S = env_int("SWEEP_INTERVAL_S", 5)
# The sweep holds during a reconnect storm (hub/agents/storm.py): while the hosts overdue plus
# those re-registered in the last HOST_OFFLINE_AFTER_S are at least this percentage of the
# fleet and at least SWEEP_STORM_MIN_HOSTS, or a web process started less than
# HOST_OFFLINE_AFTER_S ago; never longer than SWEEP_HOLD_MAX_S at a time, so a real failure is
# still seen (that much later).
SWEEP_STORM_PERCENT = env_int("SWEEP_STORM_PERCENT", 5)
SWEEP_STORM_MIN_HOSTS = env_int("SWEEP_STORM_MIN_HOSTS", 20)
SWEEP_HOLD_MAX_S = env_int("SWEEP_HOLD_MAX_S", 180)
if not 1 <= SWEEP_STORM_PERCENT <= 100 or SWEEP_STORM_MIN_HOSTS < 1 or SWEEP_HOLD_MAX_S < 0:
    raise ImproperlyConfigured(
        "SWEEP_STORM_PERCENT must be 1-100, SWEEP_STORM_MIN_HOSTS at least 1, "
        "SWEEP_HOLD_MAX_S 0 or more"
    )
CELERY_BEAT_SCHEDULE = {
    "mark-overdue-hosts-offline": {
        "task": "suppliers.mark_overdue_hosts_offline",
        "schedule": float(SWEEP_INTERVAL_S),
        # A sweep not started by the next tick is pointless: the next one does its work.
        "options": {"expires": float(SWEEP_INTERVAL_S)},
    },
    "flush-heartbeat-stats": {
        "task": "suppliers.flush_heartbeat_stats",
        "schedule": float(HOST_STATS_FLUSH_INTERVAL_S),
        # Overlapping flushes would only split the same work: the next tick takes what is left.
        "options": {"expires": float(HOST_STATS_FLUSH_INTERVAL_S)},
    },
    "redispatch-commands": {
        "task": "leases.redispatch_commands",
        "schedule": float(SWEEP_INTERVAL_S),
        # A sweep not started by the next tick is pointless: the next one does its work.
        "options": {"expires": float(SWEEP_INTERVAL_S)},
    },
    "end-leases-of-lost-hosts": {
        "task": "leases.end_leases_of_lost_hosts",
        "schedule": float(SWEEP_INTERVAL_S),
        # A sweep not started by the next tick is pointless: the next one does its work.
        "options": {"expires": float(SWEEP_INTERVAL_S)},
    },
}

# Renters' own volumes (hub/volumes): the largest size one may ask for, and how many each may
# have. The agent measures usage hourly; a volume over its size mounts into no new rental.
VOLUME_MAX_GIB = env_int("VOLUME_MAX_GIB", 1000)
VOLUME_MAX_PER_RENTER = env_int("VOLUME_MAX_PER_RENTER", 20)
# A release the host has failed to carry out for this long flags the host "release stuck": it
# takes no new rentals until the release goes through (the renter stopped paying at Stop).
RELEASE_STUCK_AFTER_S = env_int("RELEASE_STUCK_AFTER_S", 300)
CELERY_BEAT_SCHEDULE["flag-stuck-releases"] = {
    "task": "leases.flag_stuck_releases",
    "schedule": float(SWEEP_INTERVAL_S),
    "options": {"expires": float(SWEEP_INTERVAL_S)},
}
CELERY_BEAT_SCHEDULE["expire-due-leases"] = {
    "task": "leases.expire_due_leases",
    "schedule": float(SWEEP_INTERVAL_S),
    "options": {"expires": float(SWEEP_INTERVAL_S)},
}
# Retention (hub/leases/retention.py): commands of leases ended this many days ago are deleted
# (the lease row and the ledger are the record), and an ended lease's live-log backlog leaves
# Redis this long after the end (its exit-time log tail stays in Postgres).
COMMAND_RETENTION_DAYS = env_int("COMMAND_RETENTION_DAYS", 30)
LOG_BACKLOG_AFTER_END_S = env_int("LOG_BACKLOG_AFTER_END_S", 3600)
# The web process's full garbage collections (hub/serve.py, hub/lib/gc_schedule.py): at least
# every GC_FULL_INTERVAL_S, sooner once GC_LARGE_RESPONSES_MIB of responses of 1 MiB or more
# went out since the last one (not closer than 30 s).
GC_FULL_INTERVAL_S = env_int("GC_FULL_INTERVAL_S", 600)
GC_LARGE_RESPONSES_MIB = env_int("GC_LARGE_RESPONSES_MIB", 1024)
if GC_FULL_INTERVAL_S < 30 or GC_LARGE_RESPONSES_MIB < 1:
    raise ImproperlyConfigured("GC_FULL_INTERVAL_S must be at least 30, GC_LARGE_RESPONSES_MIB 1")
LEASE_RETENTION_INTERVAL_S = env_int("LEASE_RETENTION_INTERVAL_S", 600)
if COMMAND_RETENTION_DAYS < 1 or LOG_BACKLOG_AFTER_END_S < 0 or LEASE_RETENTION_INTERVAL_S < 1:
    raise ImproperlyConfigured(
        "COMMAND_RETENTION_DAYS and LEASE_RETENTION_INTERVAL_S must be at least 1, "
        "LOG_BACKLOG_AFTER_END_S at least 0"
    )
CELERY_BEAT_SCHEDULE["prune-commands"] = {
    "task": "leases.prune_commands",
    "schedule": float(LEASE_RETENTION_INTERVAL_S),
    "options": {"expires": float(LEASE_RETENTION_INTERVAL_S)},
}

# --- Dashboard (hub/web) --------------------------------------------------------------------
LOGIN_URL = "web:login"
LOGIN_REDIRECT_URL = "web:offers"
LOGOUT_REDIRECT_URL = "home"
# The login rate limit's counters live here, so every web process sees the same ones.
CACHES = {
    "default": {
        # Django's Redis cache on the process's one Redis pool, the channel layer's.
        "BACKEND": "hub.lib.shared_redis.SharedRedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": env_str("CACHE_PREFIX", REDIS_KEY_PREFIX),
    }
}
# Failed logins allowed per username and client address in LOGIN_RATE_WINDOW_S.
LOGIN_RATE_LIMIT = env_int("LOGIN_RATE_LIMIT", 5)
LOGIN_RATE_WINDOW_S = env_int("LOGIN_RATE_WINDOW_S", 900)
# Sign-ups allowed per client address in SIGNUP_RATE_WINDOW_S.
SIGNUP_RATE_LIMIT = env_int("SIGNUP_RATE_LIMIT", 5)
SIGNUP_RATE_WINDOW_S = env_int("SIGNUP_RATE_WINDOW_S", 3600)

# --- Money (hub/billing): integer micro-units, 1 unit = 1,000,000 micros --------------------
# Running leases are charged per second, in batches this often (a beat task).
BILLING_INTERVAL_S = env_int("BILLING_INTERVAL_S", 60)
# The platform's cut of each charge in basis points (1000 = 10%); the supplier earns the rest.
# Fixed on a lease when it starts.
PLATFORM_FEE_BPS = env_int("PLATFORM_FEE_BPS", 1000)
# Renters whose balance covers less than this many minutes of their rentals are warned.
BILLING_WARN_MINUTES = env_int("BILLING_WARN_MINUTES", 10)
# The smallest payout a supplier may request (micros): $10 by default, as transfers cost.
PAYOUT_MINIMUM_MICROS = env_int("PAYOUT_MINIMUM_MICROS", 10_000_000)
if not 0 <= PLATFORM_FEE_BPS <= 10_000:
    raise ImproperlyConfigured(
        f"PLATFORM_FEE_BPS must be between 0 and 10000 (100%), not {PLATFORM_FEE_BPS}"
    )
if BILLING_INTERVAL_S < 1 or BILLING_WARN_MINUTES < 1:
    raise ImproperlyConfigured("BILLING_INTERVAL_S and BILLING_WARN_MINUTES must be at least 1")
CELERY_BEAT_SCHEDULE["charge-running-leases"] = {
    "task": "leases.charge_and_release",
    "schedule": float(BILLING_INTERVAL_S),
    # Metering is cumulative: a skipped tick is caught up by the next one.
    "options": {"expires": float(BILLING_INTERVAL_S)},
}

# Hosts pull this many of the catalogue's most rented images ahead of rentals (0: none).
PREPULL_IMAGES = env_int("PREPULL_IMAGES", 3)

# What a GPU's rental may write on its host (writable layer, cache, volumes) until its supplier
# sets another allowance; a lease gets the sum of its GPUs'. 50 GiB: most images and a model.
GPU_DISK_ALLOWANCE_DEFAULT_BYTES = env_int(
    "GPU_DISK_ALLOWANCE_DEFAULT_BYTES", 50 * disk_allowance.GIB
)
if (_why := disk_allowance.out_of_bounds(GPU_DISK_ALLOWANCE_DEFAULT_BYTES)) is not None:
    raise ImproperlyConfigured(
        f"GPU_DISK_ALLOWANCE_DEFAULT_BYTES is {GPU_DISK_ALLOWANCE_DEFAULT_BYTES}: {_why}"
    )

# --- Supplier installer -----------------------------------------------------------------------
# Where the hub builds the agent wheel it serves at /agent/ (built on first request).
AGENT_DIST_DIR = Path(env_str("AGENT_DIST_DIR") or BASE_DIR / ".state" / "agent-dist")
# Signed releases (supplier_agent/release_signing.py, docs/operators.md "Signing agent
# releases"). AGENT_RELEASE_DIR: a folder signed away from the hub (one wheel and its
# release.json), served as it is instead of the wheel the hub builds. Without one, a key file
# in AGENT_RELEASE_SIGNING_KEY_FILE makes the hub sign what it builds (a trial or a lab: the key
# then lives on the hub). AGENT_RELEASE_PUBLIC_KEYS: the keys install commands pin (default:
# the signing key's, if any).
AGENT_RELEASE_DIR = env_str("AGENT_RELEASE_DIR")
AGENT_RELEASE_SIGNING_KEY_FILE = env_str("AGENT_RELEASE_SIGNING_KEY_FILE")
AGENT_RELEASE_PUBLIC_KEYS = env_list("AGENT_RELEASE_PUBLIC_KEYS")
# Offers filter on each host's uptime over 7 days as of the last refresh, this often
# (hub/catalog/uptime.py).
UPTIME_REFRESH_S = env_int("UPTIME_REFRESH_S", 300)
CELERY_BEAT_SCHEDULE["refresh-uptimes"] = {
    "task": "catalog.refresh_uptimes",
    "schedule": float(UPTIME_REFRESH_S),
    "options": {"expires": float(UPTIME_REFRESH_S)},
}
# Staged rollouts of the served release (hub/rollouts, docs/operators.md "Rolling out an agent
# release"). Every ROLLOUT_TICK_S the beat advances the running rollout. A host told to upgrade
# has ROLLOUT_HOST_TIMEOUT_S to come back at the version; it is then watched for
# ROLLOUT_OBSERVE_S (an offline spell in it counts against the release). A wave whose failed
# share exceeds the offline share among the other hosts by ROLLOUT_MAX_FAILURE_PERCENT points
# pauses the rollout and rolls the wave back. Hosts whose rental started less than
# ROLLOUT_FRESH_RENTAL_S ago wait (unless the rollout is forced).
ROLLOUT_TICK_S = env_int("ROLLOUT_TICK_S", 5)
ROLLOUT_HOST_TIMEOUT_S = env_int("ROLLOUT_HOST_TIMEOUT_S", 900)
ROLLOUT_OBSERVE_S = env_int("ROLLOUT_OBSERVE_S", 300)
ROLLOUT_MAX_FAILURE_PERCENT = env_int("ROLLOUT_MAX_FAILURE_PERCENT", 10)
ROLLOUT_FRESH_RENTAL_S = env_int("ROLLOUT_FRESH_RENTAL_S", 600)
# An upgraded host that reconnects this many times while watched is in a crash loop.
ROLLOUT_CRASHLOOP_RESTARTS = env_int("ROLLOUT_CRASHLOOP_RESTARTS", 3)
# Upgrades told per tick at most: thousands of agents do not fetch the wheel in one second.
ROLLOUT_SEND_PER_TICK = env_int("ROLLOUT_SEND_PER_TICK", 200)
if (
    min(ROLLOUT_TICK_S, ROLLOUT_HOST_TIMEOUT_S, ROLLOUT_CRASHLOOP_RESTARTS, ROLLOUT_SEND_PER_TICK)
    < 1
):
    raise ImproperlyConfigured(
        "ROLLOUT_TICK_S, ROLLOUT_HOST_TIMEOUT_S, ROLLOUT_CRASHLOOP_RESTARTS and "
        "ROLLOUT_SEND_PER_TICK must be at least 1"
    )
if ROLLOUT_OBSERVE_S < 0:
    raise ImproperlyConfigured("ROLLOUT_OBSERVE_S must be 0 or more")
if not 0 <= ROLLOUT_MAX_FAILURE_PERCENT <= 100:
    raise ImproperlyConfigured("ROLLOUT_MAX_FAILURE_PERCENT must be between 0 and 100")
CELERY_BEAT_SCHEDULE["advance-rollouts"] = {
    "task": "rollouts.advance",
    "schedule": float(ROLLOUT_TICK_S),
    "options": {"expires": float(ROLLOUT_TICK_S)},
}

# --- Tunnels (a public URL per container port, through the SSH gateway) ---------------------
# Tunnels are on when a domain and the gateway's ssh address and host keys are set: every
# declared container port of a lease then gets https://<id>-i.<TUNNEL_DOMAIN>.
TUNNEL_DOMAIN = env_str("TUNNEL_DOMAIN").strip(".").lower()
TUNNEL_URL_SCHEME = env_str("TUNNEL_URL_SCHEME", "https")
# The edge's port in renters' URLs when it is not the scheme's default (the local trial's
# http://<id>-i.localhost:8080/); empty: none.
TUNNEL_URL_PORT = env_str("TUNNEL_URL_PORT")
# Where the hub's worker connects to reach a rental's URL for a benchmark (host:port of the
# edge, as curl --connect-to; the URL's host name still goes in Host and TLS): for a worker
# beside the edge, or one whose DNS does not resolve the tunnel domain. Empty: the URL's host.
TUNNEL_EDGE_CONNECT = env_str("TUNNEL_EDGE_CONNECT")

# --- Benchmarks against rentals' URLs (hub/benchmarks) ----------------------------------------
# Bounds on what a renter may ask the worker to send: it must not become a load cannon.
BENCH_MAX_REQUESTS = env_int("BENCH_MAX_REQUESTS", 200)
BENCH_MAX_CONCURRENCY = env_int("BENCH_MAX_CONCURRENCY", 8)
BENCH_MAX_ISL = env_int("BENCH_MAX_ISL", 4096)
BENCH_MAX_OSL = env_int("BENCH_MAX_OSL", 1024)
# The whole run, and any one request within it.
BENCH_MAX_DURATION_S = env_int("BENCH_MAX_DURATION_S", 120)
# Runs at once on the whole hub: each holds a worker process for up to BENCH_MAX_DURATION_S.
BENCH_MAX_RUNNING = env_int("BENCH_MAX_RUNNING", 2)
# Runs kept per lease (the oldest go when a new one is asked for).
BENCH_RUNS_KEPT = env_int("BENCH_RUNS_KEPT", 20)
if min(
    BENCH_MAX_REQUESTS, BENCH_MAX_CONCURRENCY, BENCH_MAX_ISL, BENCH_MAX_OSL, BENCH_MAX_RUNNING
) < 1 or not (1 <= BENCH_MAX_DURATION_S <= 3600):
    raise ImproperlyConfigured(
        "BENCH_MAX_* must be at least 1, and BENCH_MAX_DURATION_S between 1 and 3600"
    )
TUNNEL_GATEWAY_SSH_HOST = env_str("TUNNEL_GATEWAY_SSH_HOST")
TUNNEL_GATEWAY_SSH_PORT = env_int("TUNNEL_GATEWAY_SSH_PORT", 2222)
TUNNEL_GATEWAY_USER = env_str("TUNNEL_GATEWAY_USER", "cloudgpu-tunnel")
# Renters' own SSH logins to the gateway (ssh -J / -L to their running rentals' ports), as a
# login user of their own; empty turns renter SSH off. What the lease page tells renters to
# connect to defaults to where agents connect.
TUNNEL_GATEWAY_RENTER_USER = env_str("TUNNEL_GATEWAY_RENTER_USER", "cloudgpu-ssh")
if TUNNEL_GATEWAY_RENTER_USER and TUNNEL_GATEWAY_RENTER_USER == TUNNEL_GATEWAY_USER:
    raise ImproperlyConfigured(
        "TUNNEL_GATEWAY_RENTER_USER must differ from TUNNEL_GATEWAY_USER: renters and agents "
        "get different rights on the gateway"
    )
TUNNEL_GATEWAY_PUBLIC_SSH_HOST = env_str("TUNNEL_GATEWAY_PUBLIC_SSH_HOST", TUNNEL_GATEWAY_SSH_HOST)
TUNNEL_GATEWAY_PUBLIC_SSH_PORT = env_int("TUNNEL_GATEWAY_PUBLIC_SSH_PORT", TUNNEL_GATEWAY_SSH_PORT)
# The gateway sshd's public host key(s), one per line: agents trust only these.
TUNNEL_GATEWAY_HOST_KEYS_FILE = env_str("TUNNEL_GATEWAY_HOST_KEYS_FILE")
# Shared by the gateway (its sshd key lookups and its edge proxy) and the hub's /internal/tunnels/.
try:
    TUNNEL_GATEWAY_SECRET = env_secret("TUNNEL_GATEWAY_SECRET")
except EnvError as exc:
    raise ImproperlyConfigured(str(exc)) from None
# Ports on the gateway's loopback that forwards listen on. Below Linux's ephemeral range
# (32768-60999): the edge's own connections to forwards take local ports from that range, and a
# forward whose port one of them holds cannot listen.
TUNNEL_LISTEN_PORT_MIN = env_int("TUNNEL_LISTEN_PORT_MIN", 10000)
TUNNEL_LISTEN_PORT_MAX = env_int("TUNNEL_LISTEN_PORT_MAX", 32767)
if not 1024 <= TUNNEL_LISTEN_PORT_MIN <= TUNNEL_LISTEN_PORT_MAX <= 65535:
    raise ImproperlyConfigured(
        "TUNNEL_LISTEN_PORT_MIN..MAX must be a range within 1024-65535, "
        f"not {TUNNEL_LISTEN_PORT_MIN}-{TUNNEL_LISTEN_PORT_MAX}"
    )
# A port freed by a lease is not handed to another for this long, so that a forward an
# unreachable agent still holds cannot capture a new renter's URL.
TUNNEL_PORT_QUARANTINE_S = env_int("TUNNEL_PORT_QUARANTINE_S", 3600)
# Renters' access tokens for protected URLs stay valid this long (the lease's end ends them).
TUNNEL_ACCESS_TOKEN_MAX_AGE_S = env_int("TUNNEL_ACCESS_TOKEN_MAX_AGE_S", 30 * 24 * 3600)
# The gateway's edge: how long a response may stay quiet before it is cut (the gateway reads the
# same variable). Refused here too below the gateway's floor (gateway_config.TIMEOUT_FLOOR_S), so
# a shared .env that would cut long generations fails loudly wherever it is read.
TUNNEL_EDGE_TIMEOUT_S = env_int("TUNNEL_EDGE_TIMEOUT_S", 900)
if TUNNEL_EDGE_TIMEOUT_S < 620:
    raise ImproperlyConfigured(
        f"TUNNEL_EDGE_TIMEOUT_S {TUNNEL_EDGE_TIMEOUT_S} is below 620 s: the edge would cut long "
        "generations that stay quiet that long (default 900)"
    )

# --- Observability: /metrics (hub/health/metrics_view.py) and GPU health ----------------------
# Who may scrape /metrics: clients from these networks (comma-separated addresses or CIDRs),
# or anyone presenting `Authorization: Bearer <METRICS_TOKEN>` (also METRICS_TOKEN_FILE).
# Behind a reverse proxy the client address is the proxy's: use the token there.
try:
    METRICS_TOKEN = env_secret("METRICS_TOKEN")
except EnvError as exc:
    raise ImproperlyConfigured(str(exc)) from None
METRICS_ALLOW_IPS = env_list("METRICS_ALLOW_IPS", ["127.0.0.1/32", "::1/128"])
try:
    METRICS_ALLOW_NETWORKS = [
        ipaddress.ip_network(item, strict=False) for item in METRICS_ALLOW_IPS
    ]
except ValueError as exc:
    raise ImproperlyConfigured(f"METRICS_ALLOW_IPS: {exc}") from None
if METRICS_TOKEN and len(METRICS_TOKEN) < 16:
    raise ImproperlyConfigured("METRICS_TOKEN must be at least 16 characters")

# When the hub delists a GPU on its agent's health report (hub/leases/gpu_faults.py):
# any of these XIDs (NVIDIA's list of errors that mean the board, not the program, failed:
# 48 double-bit ECC, 61/62 internal micro-controller, 63/64 ECC page retirement or row
# remapping, 74 NVLink, 79 fallen off the bus, 92 high single-bit ECC rate, 94/95 contained and
# uncontained ECC, 119/120 GSP, 140 unrecovered ECC), at least this many uncorrected ECC
# errors since the driver loaded (0: never), a GPU NVML reports lost, and thermal slowdown only
# if asked for (throttling is slow, not broken).
_DEFAULT_DELIST_XIDS = [
    "48",
    "61",
    "62",
    "63",
    "64",
    "74",
    "79",
    "92",
    "94",
    "95",
    "119",
    "120",
    "140",
]
try:
    GPU_DELIST_XIDS = frozenset(int(x) for x in env_list("GPU_DELIST_XIDS", _DEFAULT_DELIST_XIDS))
except ValueError:
    raise ImproperlyConfigured("GPU_DELIST_XIDS must be comma-separated XID numbers") from None
GPU_DELIST_ECC_UNCORRECTED = env_int("GPU_DELIST_ECC_UNCORRECTED", 1)
GPU_DELIST_LOST = env_bool("GPU_DELIST_LOST", True)
GPU_DELIST_THERMAL = env_bool("GPU_DELIST_THERMAL", False)

# --- Notifications (hub/notifications): email and signed webhooks ----------------------------
# Email through Django's framework: EMAIL_BACKEND is SMTP unless set (`make run` sets the
# console backend: mail shows in the worker's log); EMAIL_HOST, EMAIL_PORT, EMAIL_HOST_USER,
# EMAIL_HOST_PASSWORD (or _FILE), EMAIL_USE_TLS / EMAIL_USE_SSL, DEFAULT_FROM_EMAIL.
EMAIL_BACKEND = env_str("EMAIL_BACKEND", "django.core.mail.backends.smtp.EmailBackend")
EMAIL_HOST = env_str("EMAIL_HOST", "localhost")
EMAIL_PORT = env_int("EMAIL_PORT", 25)
EMAIL_HOST_USER = env_str("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = env_secret("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", False)
EMAIL_USE_SSL = env_bool("EMAIL_USE_SSL", False)
EMAIL_TIMEOUT = env_int("EMAIL_TIMEOUT", 10)
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "CloudGPU <notifications@localhost>")
if EMAIL_USE_TLS and EMAIL_USE_SSL:
    raise ImproperlyConfigured("EMAIL_USE_TLS and EMAIL_USE_SSL: set one of them, not both")
# A burst of one kind for one account within this many seconds becomes one event.
NOTIFY_COALESCE_S = env_int("NOTIFY_COALESCE_S", 30)
# The beat's sweep of due events and deliveries (what a lost task left, coalesced events).
NOTIFY_SWEEP_S = env_int("NOTIFY_SWEEP_S", 5)
# The low-balance threshold of an account that never set one (micro-USD; 0: none).
NOTIFY_LOW_BALANCE_DEFAULT_MICROS = env_int("NOTIFY_LOW_BALANCE_DEFAULT_MICROS", 5_000_000)
# Each webhook request as a whole (connect, send, answer); retries back off from
# WEBHOOK_RETRY_BASE_S (hub/notifications/delivery.py) until WEBHOOK_RETRY_FOR_S after the event.
WEBHOOK_TIMEOUT_S = env_int("WEBHOOK_TIMEOUT_S", 5)
WEBHOOK_RETRY_BASE_S = env_int("WEBHOOK_RETRY_BASE_S", 30)
WEBHOOK_RETRY_FOR_S = env_int("WEBHOOK_RETRY_FOR_S", 86400)
# Webhooks to loopback (and plain http there): a developer's receiver; never in production.
WEBHOOK_ALLOW_LOOPBACK = env_bool("WEBHOOK_ALLOW_LOOPBACK", DEBUG)
NOTIFICATION_RETENTION_DAYS = env_int("NOTIFICATION_RETENTION_DAYS", 30)
if min(NOTIFY_SWEEP_S, WEBHOOK_TIMEOUT_S, WEBHOOK_RETRY_BASE_S, NOTIFICATION_RETENTION_DAYS) < 1:
    raise ImproperlyConfigured(
        "NOTIFY_SWEEP_S, WEBHOOK_TIMEOUT_S, WEBHOOK_RETRY_BASE_S and NOTIFICATION_RETENTION_DAYS "
        "must be at least 1"
    )
if NOTIFY_COALESCE_S < 0 or WEBHOOK_RETRY_FOR_S < 0 or NOTIFY_LOW_BALANCE_DEFAULT_MICROS < 0:
    raise ImproperlyConfigured(
        "NOTIFY_COALESCE_S, WEBHOOK_RETRY_FOR_S and NOTIFY_LOW_BALANCE_DEFAULT_MICROS cannot be "
        "negative"
    )
CELERY_BEAT_SCHEDULE["notify-events"] = {
    "task": "notifications.process_events",
    "schedule": float(NOTIFY_SWEEP_S),
    "options": {"expires": float(NOTIFY_SWEEP_S)},
}
CELERY_BEAT_SCHEDULE["notify-webhooks"] = {
    "task": "notifications.deliver_webhooks",
    "schedule": float(NOTIFY_SWEEP_S),
    "options": {"expires": float(NOTIFY_SWEEP_S)},
}
CELERY_BEAT_SCHEDULE["notify-prune"] = {
    "task": "notifications.prune",
    "schedule": float(LEASE_RETENTION_INTERVAL_S),
    "options": {"expires": float(LEASE_RETENTION_INTERVAL_S)},
}
