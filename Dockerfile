# syntax=docker/dockerfile:1
# perencode on the paper's stack: PyTorch 2.1.1, CUDA 12.1, cuDNN 8, Python 3.10 (the paper's
# experiments ran on PyTorch 2.1.1: docs/paper-facts.md#training-settings). Build:
# `make docker-build`; use: docs/container.md.

# Stage 1: build the package's wheel. Nothing of this stage reaches the final image.
FROM pytorch/pytorch:2.1.1-cuda12.1-cudnn8-runtime AS wheel
WORKDIR /src
COPY constraints/py310-torch2.1.1.txt /tmp/constraints.txt
COPY pyproject.toml README.md ./
COPY perencode ./perencode
# PIP_CONSTRAINT, unlike --constraint alone, also reaches pip's isolated build environment, so
# the build backend (setuptools) is pinned too.
RUN PIP_CONSTRAINT=/tmp/constraints.txt \
    pip wheel --no-cache-dir --no-deps --constraint /tmp/constraints.txt --wheel-dir /wheels .

# Stage 2: the runtime image.
FROM pytorch/pytorch:2.1.1-cuda12.1-cudnn8-runtime
# The commit the image was built from (`make docker-build` passes `git rev-parse HEAD`): the
# installed wheel has no checkout, so every run's env.json reads it from PERENCODE_GIT_COMMIT.
ARG GIT_COMMIT=unknown
LABEL org.opencontainers.image.title="perencode" \
      org.opencontainers.image.description="Reproduction of 'Positional Encoding Helps Recurrent Neural Networks Handle a Large Vocabulary' (Morita, TMLR) on PyTorch 2.1.1 / CUDA 12.1" \
      org.opencontainers.image.revision="${GIT_COMMIT}"

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PERENCODE_GIT_COMMIT=${GIT_COMMIT}

COPY constraints/py310-torch2.1.1.txt /opt/perencode/constraints.txt
COPY --from=wheel /wheels /tmp/wheels

# The package goes into a venv that also sees the image's conda site-packages: torch 2.1.1 (with
# its CUDA 12.1 libraries) is used from there and never reinstalled, while the pinned
# dependencies land in the venv and shadow conda's copies, which pip could not uninstall
# (conda leaves no RECORD files). `datasets` (the [hf] extra) lets `lm-prepare` fetch
# WikiText-103 where the node has a network. `python -m pip` runs the venv's pip, or the image's where
# venv found it already there; either installs into the venv. The torch check stops the build
# before pip could fetch another torch should the base image ever stop showing its own to pip.
RUN python -m venv --system-site-packages /opt/venv \
    && /opt/venv/bin/python -c "from importlib.metadata import version; v = version('torch'); assert v.startswith('2.1.1'), v" \
    && /opt/venv/bin/python -m pip install --no-cache-dir --constraint /opt/perencode/constraints.txt /tmp/wheels/perencode-*.whl datasets \
    && /opt/venv/bin/python -c "import torch, numpy, datasets, perencode.commands.verify; assert torch.__version__.startswith('2.1.1'); assert numpy.__version__.startswith('1.'); perencode.commands.verify.claims_file('paper')" \
    && rm -rf /tmp/wheels \
    && useradd --create-home --uid 1000 --shell /bin/bash perencode \
    && mkdir -p /work/runs /work/data \
    && chown -R perencode:perencode /work

COPY --chown=perencode:perencode recipes /work/recipes

# MPLCONFIGDIR: matplotlib needs a writable config dir also when the container runs as the host
# user (`--user $(id -u):$(id -g)`), whose home does not exist in the image.
ENV PATH=/opt/venv/bin:$PATH \
    MPLCONFIGDIR=/tmp/matplotlib

# The `perencode` user made above; numeric, so that `runAsNonRoot` policies can verify it.
USER 1000:1000
WORKDIR /work
VOLUME ["/work/runs", "/work/data"]
ENTRYPOINT ["perencode"]
CMD ["--help"]
