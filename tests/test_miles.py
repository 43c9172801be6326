"""labkit.miles, the public face of the miles backend: each name it lists is its home module's,
the reward hook the script names resolves, and every name the notebooks use is listed."""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path

from labkit import miles, miles_backend, miles_command, miles_log

NOTEBOOKS = Path(__file__).parents[1] / "notebooks"


def test_public_names_are_the_home_modules():
    # a name's home is the first of these that has it (later ones import from earlier ones)
    homes = (miles_command, miles_log, miles_backend)
    assert len(miles.__all__) == len(set(miles.__all__))
    for name in miles.__all__:
        home = next((m for m in homes if hasattr(m, name)), None)
        assert home is not None, f"labkit.miles lists {name}, which no miles module defines"
        assert getattr(miles, name) is getattr(home, name), name


def test_reward_hook_resolves_to_labkits_reward():
    """miles imports --custom-rm-path as module.function: labkit.miles.miles_reward."""
    module, _, name = miles.REWARD_HOOK.rpartition(".")
    assert getattr(importlib.import_module(module), name) is miles_backend.miles_reward


def test_names_the_notebooks_use_are_listed():
    used = set()
    for nb in NOTEBOOKS.rglob("*.ipynb"):
        for cell in json.loads(nb.read_text())["cells"]:
            source = "".join(cell["source"])
            used |= set(re.findall(r"\blabkit\.miles\.(\w+)", source))
            for names in re.findall(r"from labkit\.miles import ([\w, ]+)", source):
                used |= {n.strip() for n in names.split(",")}
    assert {"render_script", "read_miles_log"} <= used  # the scan finds what lesson 1 calls
    assert used <= set(miles.__all__)
