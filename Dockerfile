# The hub image: one image for the web (Daphne), worker and beat processes.
# BASE_IMAGE and DEBIAN_IMAGE are the official images a user pulls; CI, which reaches no image
# registry, builds its own from Debian's packages (.ci/compose/base-image, the override file
# .ci/compose/docker-compose.ci.yml): a bookworm rootfs with Python and the hub's requirements
# already installed, so the steps below find nothing left to fetch.
ARG BASE_IMAGE=python:3.11-slim-bookworm
ARG DEBIAN_IMAGE=debian:bookworm-slim

# The proxy in front of the web processes: nginx from the distribution, spreading requests and
# agents' WebSockets over every `web` replica (deploy/nginx-hub.conf).
FROM ${DEBIAN_IMAGE} AS proxy
RUN dpkg -s nginx-light >/dev/null 2>&1 || { \
      apt-get update && apt-get install -y --no-install-recommends nginx-light && \
      rm -rf /var/lib/apt/lists/*; }
COPY deploy/nginx-hub.conf /etc/nginx/nginx.conf
EXPOSE 8000
CMD ["nginx", "-g", "daemon off;"]

FROM ${BASE_IMAGE} AS hub

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    STATIC_ROOT=/app/staticfiles \
    AGENT_DIST_DIR=/app/agent-dist

RUN groupadd --system cloudgpu && useradd --system --gid cloudgpu --home-dir /app cloudgpu
WORKDIR /app

COPY requirements/ requirements/
RUN pip install -r requirements/hub.txt

COPY . .
# collectstatic imports settings, which insist on real URLs and a secret; none is used here.
RUN DEBUG=1 DATABASE_URL=postgres://build@localhost/build REDIS_URL=redis://localhost:6379/0 \
    python manage.py collectstatic --noinput --verbosity 0 && \
    DEBUG=1 DATABASE_URL=postgres://build@localhost/build REDIS_URL=redis://localhost:6379/0 \
    python manage.py build_agent_wheel && chown -R cloudgpu:cloudgpu /app/agent-dist
# The shared metrics folder (docker-compose.yml's `metrics` volume takes this owner and mode
# when it is created).
RUN install -d -o cloudgpu -g cloudgpu -m 0700 /var/lib/cloudgpu-metrics

USER cloudgpu
EXPOSE 8000
# hub.serve is Daphne with its logs redacted (agent tokens may be in a path).
CMD ["python", "-m", "hub.serve", "-b", "0.0.0.0", "-p", "8000", "hub.asgi:application"]

# The tunnel gateway: the same code plus Debian's OpenSSH server and nginx. It runs as root
# (sshd must), keeps its host key in /var/lib/cloudgpu-gateway and asks the hub over HTTP.
FROM hub AS gateway
USER root
RUN { dpkg -s openssh-server nginx-light >/dev/null 2>&1 || { \
      apt-get update && apt-get install -y --no-install-recommends openssh-server nginx-light && \
      rm -rf /var/lib/apt/lists/*; }; } && \
    for user in cloudgpu-tunnel cloudgpu-ssh; do \
      useradd --system --no-create-home --shell /usr/sbin/nologin "$user" && \
      usermod -p '*' "$user" || exit 1; \
    done
EXPOSE 2222 8080
CMD ["python", "-m", "hub.tunnels.gateway", "run", "--hub-url", "http://web:8000", \
     "--folder", "/var/lib/cloudgpu-gateway"]
