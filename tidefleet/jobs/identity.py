"""Who submits a job: the cloud identity, else the OS user (and a warning that says so)."""

from __future__ import annotations

import getpass
import logging

from tidefleet.ports import Cloud

log = logging.getLogger("tidefleet.jobs")
OS_USER = "os:"  # prefix of a submitter recorded from the OS user, not the cloud identity


def identify(cloud: Cloud) -> tuple[str, str]:
    """(who, "") from the cloud identity, or (the OS user, why the cloud could not say)."""
    try:
        return cloud.identity(), ""
    except cloud.errors as err:
        try:
            who = f"{OS_USER}{getpass.getuser()}"
        except (OSError, KeyError):  # no login name and no passwd entry (some containers)
            who = f"{OS_USER}unknown"
        why = (f"could not read the {cloud.name} caller identity ({str(err).splitlines()[0][:200]}); "
               f"recording the submitter as {who}")  # fmt: skip
        return who, why


def submitter(cloud: Cloud) -> str:
    """Who submits; a warning says so when it is the OS user."""
    who, why = identify(cloud)
    if why:
        log.warning("%s", why)
    return who
