"""The bundled image recipes load, and the scenarios agree with what their image contains."""

from __future__ import annotations

import hashlib
import re

from runner.backends.images import load_recipe
from runner.core.paths import recipe_names, repo_root
from runner.core.spec import load_specs

ROOT = repo_root()


def test_every_bundled_recipe_loads_and_every_spec_names_one() -> None:
    """A recipe that fails its schema, or a spec naming an image nobody builds, fails here, not
    in the first VM test that needs it (on a fresh machine, after a long build)."""
    names = set(recipe_names())
    assert {"debian-12-nginx", "debian-12-postgres"} <= names
    for name in names:
        recipe = load_recipe(name)
        assert recipe.name == name and recipe.packages and len(recipe.key) == 16
    used = {spec.image for spec in load_specs([ROOT / "specs"])}
    assert used <= names, used - names
    assert "debian-12-postgres" in used


def _file_written_by(recipe_name: str, path: str) -> bytes:
    """The bytes a recipe's ``cat > PATH <<'EOF'`` command writes (heredoc body, as sh reads it)."""
    for command in load_recipe(recipe_name).commands:
        m = re.search(rf"cat > {re.escape(path)} <<'EOF'\n(.*?\n)EOF\n", command, re.S)
        if m:
            return m.group(1).encode()
    raise AssertionError(f"{recipe_name} does not write {path}")


def test_the_pg_scenarios_pin_the_client_the_image_installs() -> None:
    """The pg-* invariants pin /usr/local/bin/app-check by sha256: an edit of the recipe's client
    must come with the new hash in every spec, or each baseline check fails on a real VM."""
    digest = hashlib.sha256(_file_written_by("debian-12-postgres", "/usr/local/bin/app-check")).hexdigest()
    pg = [s for s in load_specs([ROOT / "specs"]) if s.image == "debian-12-postgres"]
    assert len(pg) >= 3
    for spec in pg:
        pins = [p for p in spec.invariants if "app-check" in p.name or "client" in p.name]
        assert pins, f"{spec.id} does not pin the application's client"
        text = (ROOT / "specs" / f"{spec.id}.yaml").read_text()
        assert digest in text, f"{spec.id} pins another app-check than the image installs"


def test_the_tls_scenarios_pin_what_the_image_installs() -> None:
    """The tls-* invariants pin the health check client and the backend by sha256, and the CA
    by the public key of the fixed key in the recipe: an edit of any of them in the recipe must
    come with the new value in every spec, or each baseline check fails on a real VM."""
    client = hashlib.sha256(_file_written_by("debian-12-tls", "/usr/local/bin/site-check")).hexdigest()
    backend = hashlib.sha256(_file_written_by("debian-12-tls", "/opt/shop/app.py")).hexdigest()
    recipe_text = load_recipe("debian-12-tls").path.read_text()
    pin = re.search(r"SubjectPublicKeyInfo \(DER\) is\n#\s+([0-9a-f]{64})\.", recipe_text)
    assert pin and recipe_text.count(pin.group(1)) == 2, "the recipe's CA pin (comment and check) disagree"
    tls = [s for s in load_specs([ROOT / "specs"]) if s.image == "debian-12-tls"]
    assert len(tls) >= 3
    for spec in tls:
        text = (ROOT / "specs" / f"{spec.id}.yaml").read_text()
        for what, digest in (("site-check", client), ("the backend", backend), ("the CA", pin.group(1))):
            assert digest in text, f"{spec.id} does not pin {what} the image installs"
