"""The core: what a run *is*, independent of where its answers come from.

Specs, probes, protocols, the episode loop, the ``Guest`` and ``Model``
interfaces, the clock, and the cassette format with its replayers. Nothing
here imports the backends (QEMU, SSH, llama-server) or the application
(cli, bench): offline replay runs exactly this code, so it must be
exercisable without a VM or a model server. ``make lint`` checks that.
"""
