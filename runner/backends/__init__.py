"""The backends: real machinery behind the core's interfaces.

QEMU sandboxes and golden snapshots, guest images, the serial and SSH
transports, the OpenAI-compatible client, llama-server and its models,
child processes and the per-user cache. Backends import the core, never
the application.
"""
