"""Default hourly prices (USD) per instance type: on-demand list price and a typical spot price.

Approximate us-east-1 / us-central1 Linux prices (2025 price lists; spot as a typical observed
level). They are defaults for the cost cap and the simulator only; set `on_demand_price` /
`spot_price` on an instance type in the environment file to use your own.
"""

# type: (on_demand, spot)
DEFAULT_PRICES: dict[str, tuple[float, float]] = {
    # AWS general purpose / compute
    "t3.medium": (0.0416, 0.0125),
    "t3.large": (0.0832, 0.0250),
    "c6i.large": (0.085, 0.034),
    "c6i.xlarge": (0.17, 0.068),
    "c6i.2xlarge": (0.34, 0.136),
    "c6i.4xlarge": (0.68, 0.272),
    "c7i.large": (0.08925, 0.036),
    "c7i.xlarge": (0.1785, 0.071),
    "c7i.2xlarge": (0.357, 0.143),
    "m6i.large": (0.096, 0.038),
    "m6i.xlarge": (0.192, 0.077),
    "m6i.2xlarge": (0.384, 0.154),
    "m7i.xlarge": (0.2016, 0.081),
    "r6i.xlarge": (0.252, 0.101),
    # AWS GPU
    "g4dn.xlarge": (0.526, 0.21),
    "g4dn.2xlarge": (0.752, 0.30),
    "g4dn.12xlarge": (3.912, 1.56),
    "g5.xlarge": (1.006, 0.40),
    "g5.2xlarge": (1.212, 0.48),
    "g5.12xlarge": (5.672, 2.27),
    "g5.48xlarge": (16.288, 6.52),
    "g6.xlarge": (0.8048, 0.32),
    "g6.12xlarge": (4.6016, 1.84),
    "p3.2xlarge": (3.06, 0.92),
    "p3.8xlarge": (12.24, 3.67),
    "p4d.24xlarge": (32.7726, 13.1),
    # GCP (machine price; GPU machines include one attached GPU of their usual kind)
    "e2-standard-4": (0.134, 0.040),
    "n2-standard-4": (0.194, 0.047),
    "n2-standard-8": (0.388, 0.094),
    "n1-standard-8": (0.38, 0.08),
    "g2-standard-8": (0.854, 0.34),
    "a2-highgpu-1g": (3.673, 1.10),
}


def default_price(instance_type: str, spot: bool) -> float | None:
    pair = DEFAULT_PRICES.get(instance_type)
    return None if pair is None else pair[1 if spot else 0]


# type: (vCPUs, memory GiB, GPUs, memory GiB per GPU), from the AWS instance-type pages and the
# GCE machine-type docs; `tidefleet rightsize` sizes items against these.
SPECS: dict[str, tuple[int, float, int, float]] = {
    "t3.medium": (2, 4, 0, 0),
    "t3.large": (2, 8, 0, 0),
    "c6i.large": (2, 4, 0, 0),
    "c6i.xlarge": (4, 8, 0, 0),
    "c6i.2xlarge": (8, 16, 0, 0),
    "c6i.4xlarge": (16, 32, 0, 0),
    "c7i.large": (2, 4, 0, 0),
    "c7i.xlarge": (4, 8, 0, 0),
    "c7i.2xlarge": (8, 16, 0, 0),
    "m6i.large": (2, 8, 0, 0),
    "m6i.xlarge": (4, 16, 0, 0),
    "m6i.2xlarge": (8, 32, 0, 0),
    "m7i.xlarge": (4, 16, 0, 0),
    "r6i.xlarge": (4, 32, 0, 0),
    "g4dn.xlarge": (4, 16, 1, 16),  # T4
    "g4dn.2xlarge": (8, 32, 1, 16),
    "g4dn.12xlarge": (48, 192, 4, 16),
    "g5.xlarge": (4, 16, 1, 24),  # A10G
    "g5.2xlarge": (8, 32, 1, 24),
    "g5.12xlarge": (48, 192, 4, 24),
    "g5.48xlarge": (192, 768, 8, 24),
    "g6.xlarge": (4, 16, 1, 24),  # L4
    "g6.12xlarge": (48, 192, 4, 24),
    "p3.2xlarge": (8, 61, 1, 16),  # V100
    "p3.8xlarge": (32, 244, 4, 16),
    "p4d.24xlarge": (96, 1152, 8, 40),  # A100 40 GB
    "e2-standard-4": (4, 16, 0, 0),
    "n2-standard-4": (4, 16, 0, 0),
    "n2-standard-8": (8, 32, 0, 0),
    "n1-standard-8": (8, 30, 0, 0),
    "g2-standard-8": (8, 32, 1, 24),  # L4
    "a2-highgpu-1g": (12, 85, 1, 40),  # A100 40 GB
}

# The types of SPECS that take an Elastic Fabric Adapter (Amazon EC2 User Guide, "Elastic Fabric
# Adapter", Supported instance types): EFA comes with the large sizes only (g5.12xlarge, not g5.2xlarge).
EFA_TYPES = frozenset({"g4dn.12xlarge", "g5.12xlarge", "g5.48xlarge", "g6.12xlarge", "p4d.24xlarge"})
