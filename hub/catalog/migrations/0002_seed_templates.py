"""The starting catalogue; admins edit it afterwards (this migration never overwrites edits)."""

from __future__ import annotations

from typing import Any

from django.db import migrations

GIB = 1 << 30

TEMPLATES: list[dict[str, Any]] = [
    {
        "slug": "pytorch-jupyterlab",
        "name": "PyTorch + JupyterLab",
        "description": "PyTorch with CUDA and JupyterLab on port 8888 (token off: protect the URL).",
        "image": "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime",
        "ports": [8888],
        "env": {"JUPYTER_ENABLE_LAB": "yes"},
        "command": [
            "bash",
            "-c",
            "pip install --quiet jupyterlab && jupyter lab --ip=0.0.0.0 --port=8888 "
            "--no-browser --allow-root --ServerApp.token='' --ServerApp.root_dir=/workspace",
        ],
        "cache_volume_path": "/root/.cache",
        "min_vram_bytes": 8 * GIB,
        "position": 10,
    },
    {
        "slug": "vllm-openai",
        "name": "vLLM (OpenAI-compatible server)",
        "description": "vLLM serving a Hugging Face model with the OpenAI API on port 8000. "
        "Set MODEL (and HF_TOKEN for gated models).",
        "image": "vllm/vllm-openai:v0.6.4",
        "ports": [8000],
        "env": {"MODEL": "Qwen/Qwen2.5-1.5B-Instruct"},
        "entrypoint": ["bash", "-c"],
        "command": [
            'exec python3 -m vllm.entrypoints.openai.api_server --host 0.0.0.0 --port 8000 --model "$MODEL"'
        ],
        "cache_volume_path": "/root/.cache/huggingface",
        "min_vram_bytes": 16 * GIB,
        "position": 20,
    },
    {
        "slug": "comfyui",
        "name": "ComfyUI",
        "description": "Node-based Stable Diffusion UI on port 8188.",
        "image": "yanwk/comfyui-boot:cu124-slim",
        "ports": [8188],
        "env": {"CLI_ARGS": "--listen 0.0.0.0"},
        "cache_volume_path": "/root",
        "min_vram_bytes": 8 * GIB,
        "position": 30,
    },
    {
        "slug": "ubuntu-ssh",
        "name": "Ubuntu with SSH",
        "description": "Plain Ubuntu 24.04 with an SSH server on port 22 (set PUBLIC_KEY).",
        "image": "ubuntu:24.04",
        "ports": [22],
        "env": {"PUBLIC_KEY": ""},
        "command": [
            "bash",
            "-c",
            "apt-get update -qq && apt-get install -y -qq openssh-server >/dev/null && "
            'mkdir -p /run/sshd /root/.ssh && echo "$PUBLIC_KEY" > /root/.ssh/authorized_keys && '
            "exec /usr/sbin/sshd -D -e",
        ],
        "cache_volume_path": "",
        "min_vram_bytes": 0,
        "position": 40,
    },
]


def seed(apps: Any, schema_editor: Any) -> None:
    Template = apps.get_model("catalog", "Template")
    for fields in TEMPLATES:
        Template.objects.get_or_create(slug=fields["slug"], defaults=fields)


class Migration(migrations.Migration):
    dependencies = [("catalog", "0001_initial")]
    operations = [migrations.RunPython(seed, migrations.RunPython.noop)]
