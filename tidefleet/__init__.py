"""tidefleet: queue-driven, spot-first ML compute."""

__version__ = "0.1.0"
