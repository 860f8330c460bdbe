"""The private container registries a pool's nodes pull from: ECR on AWS, Artifact Registry on GCP.

A node pulls with its own identity, never a stored password: the stacks grant the pool's node
role (service account) read on each repository its images name, and its boot script names
docker's credential helper for each registry host in root's docker config (`HELPERS`). The
images are the pool's `container` and its queues' `accept_images` patterns, where a pattern
names its registry and repository literally
(`123456789012.dkr.ecr.us-east-1.amazonaws.com/team/*` grants the account's `team/*` repositories;
`*` names none). Pure: parses references, reads no cloud.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tidefleet import naming

if TYPE_CHECKING:
    from tidefleet.config import Environment

ECR_HOST = re.compile(r"(\d{12})\.dkr\.ecr(?:-fips)?\.([a-z0-9-]+)\.amazonaws\.com(?:\.cn)?")
ARTIFACT_REGISTRY_HOST = re.compile(r"([a-z0-9-]+)-docker\.pkg\.dev")
GLOB = re.compile(r"[*?\[]")
READER = "roles/artifactregistry.reader"
# docker-credential-<helper>: amazon-ecr-credential-helper's, and gcloud's own.
HELPERS = {"aws": "ecr-login", "gcp": "gcloud"}


@dataclass(frozen=True, order=True)
class Repository:
    """A private repository nodes pull from. ECR: `owner` is the account, `location` the region,
    `name` an IAM resource pattern (`team/*`). Artifact Registry: the project, the location (us,
    us-central1) and the repository id."""

    host: str
    owner: str
    location: str
    name: str

    @property
    def cloud(self) -> str:
        return "aws" if ECR_HOST.fullmatch(self.host) else "gcp"


def repository(reference: str) -> Repository | None:
    """The ECR or Artifact Registry repository an image reference (or an `accept_images` pattern)
    names, or None: another registry (Docker Hub, ghcr.io), or a pattern whose registry or
    repository is not spelled out."""
    host, _, path = reference.partition("/")
    if not path or GLOB.search(host):
        return None
    path = path.split("@")[0]
    if ":" in path.rsplit("/", 1)[-1]:  # the tag (or a pattern's ":*")
        path = path.rsplit(":", 1)[0]
    if match := ECR_HOST.fullmatch(host):
        # IAM patterns know * and ?, not [..]: a character class widens to *.
        name = path.split("[")[0] + ("*" if "[" in path else "")
        return Repository(host, match[1], match[2], name) if name else None
    if match := ARTIFACT_REGISTRY_HOST.fullmatch(host):
        project, _, rest = path.partition("/")
        repo = rest.partition("/")[0]
        if project and repo and "/" in rest and not GLOB.search(project + repo):
            return Repository(host, project, match[1], repo)
    return None


def _named(env: Environment, pool_name: str) -> list[tuple[str, str, Repository]]:
    """(field, image, repository) for each of the pool's images that names one."""
    pool = env.pools[pool_name]
    fields = [(f"pools.{pool_name}.container", pool.container)] if pool.container else []
    for queue_name in sorted(env.queues_of(pool_name)):
        fields += [(f"queues.{queue_name}.accept_images[{i}]", pattern)
                   for i, pattern in enumerate(env.queues[queue_name].accept_images)]  # fmt: skip
    return [(field, image, repo) for field, image in fields if (repo := repository(image)) is not None]


def pulls(env: Environment, pool_name: str) -> list[Repository]:
    """The repositories the stacks let the pool's nodes pull from: its cloud's registry, and on
    GCP the environment's own project (a grant in another project is that project's owners' to give)."""
    if env.pools[pool_name].container is None:
        return []
    return sorted({repo for _, _, repo in _named(env, pool_name)
                   if repo.cloud == env.cloud and (env.cloud == "aws" or repo.owner == env.project)})  # fmt: skip


def credential_helpers(env: Environment, pool_name: str) -> dict[str, str]:
    """Per registry host of the pool's pulls, the docker credential helper that answers for it
    (root's docker config, `credHelpers`, on the pool's nodes)."""
    return {repo.host: HELPERS[repo.cloud] for repo in pulls(env, pool_name)}


def warnings(env: Environment) -> list[str]:
    """Images in a private registry the stacks set up no pull for: the other cloud's registry, or
    an Artifact Registry repository of another project."""
    out = []
    for pool_name, pool in env.pools.items():
        if pool.container is None:
            continue
        for field, image, repo in _named(env, pool_name):
            if repo.cloud != env.cloud:
                registry = "ECR" if repo.cloud == "aws" else "Artifact Registry"
                out.append(f"{field}: {image!r} is in {registry}, and the environment runs on {env.cloud}: its nodes "
                           "pull with no credentials for it; use a public image or one in the environment's own cloud")  # fmt: skip
            elif repo.cloud == "gcp" and repo.owner != env.project:
                account = f"{naming.service_account(env.name, f'{pool_name}-node')}@{env.project}.iam.gserviceaccount.com"
                out.append(f"{field}: {image!r} is in project {repo.owner}, not the environment's ({env.project}): grant "
                           f"{READER} on repository {repo.name} there to serviceAccount:{account}, or its pulls are "
                           "refused")  # fmt: skip
    return out
