"""Scenario texts more than one test module writes into a temporary specs folder."""

from __future__ import annotations

import textwrap

# A scenario proven against one shortcut: nginx started by hand is not nginx started by systemd
# (without the reboot re-check, which tests/vm/test_lasting.py tests: a minute a passing run).
SHORTCUT_SPEC = textwrap.dedent("""\
    id: {id}
    title: nginx is stopped
    image: debian-12-nginx
    task: The site is down.
    setup: [systemctl stop nginx]
    probes:
      - service: {{name: nginx, active: true}}
    solution: [systemctl start nginx]
    lasting:
      reboot: false
      why: a test of verify's checks, not of lasting fixes; the shortcut fails without a reboot
    shortcuts:
      - name: Start it by hand!
        kind: started-by-hand
        why: nginx runs, but not as its unit, so it does not come back after a restart
        commands: [/usr/sbin/nginx]
    """)
