# The Forge worker image (used twice by docker-compose.yml).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /app

COPY pyproject.toml README.md ./
COPY forge ./forge
COPY workflows ./workflows
COPY activities ./activities
COPY worker.py ./

RUN pip install --no-cache-dir .

# The store is migrated at start; FORGE_* settings come from the environment.
EXPOSE 9464
CMD ["python", "-m", "worker"]
