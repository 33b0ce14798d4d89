# The worker / producer image: the library, the workers app and nothing else.
FROM python:3.12-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY priority_router ./priority_router
COPY workers ./workers
RUN pip install --no-cache-dir ".[metrics]" flower
RUN useradd --create-home --uid 1000 worker
USER worker
CMD ["celery", "-A", "workers.app", "worker", "--loglevel", "INFO"]
