"""Cloud function entry points: thin handlers over the tidefleet library."""
