"""labkit.miles, the public face of the miles backend: each name it lists is its home module's,
the reward hook the script names resolves, and every name the notebooks use is listed."""

from __future__ import annotations

import importlib

from public_faces import assert_reexports, names_used_in_notebooks

from labkit import miles
from labkit.miles import backend as miles_backend
from labkit.miles import command as miles_command
from labkit.miles import log as miles_log


def test_public_names_are_the_home_modules():
    assert_reexports(miles, (miles_command, miles_log, miles_backend))

def test_reward_hook_resolves_to_labkits_reward():
    """miles imports --custom-rm-path as module.function: labkit.miles.miles_reward."""
    module, _, name = miles.REWARD_HOOK.rpartition(".")
    assert getattr(importlib.import_module(module), name) is miles_backend.miles_reward


def test_names_the_notebooks_use_are_listed():
    used = names_used_in_notebooks("labkit.miles")
    assert {"render_script", "read_miles_log"} <= used  # the scan finds what lesson 1 calls
    assert used <= set(miles.__all__)
