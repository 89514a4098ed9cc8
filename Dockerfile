# The hub image: one image for the web (Daphne), worker and beat processes.
FROM python:3.11-slim-bookworm

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

USER cloudgpu
EXPOSE 8000
# hub.serve is Daphne with its logs redacted (agent tokens may be in a path).
CMD ["python", "-m", "hub.serve", "-b", "0.0.0.0", "-p", "8000", "hub.asgi:application"]
