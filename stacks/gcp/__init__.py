"""The GCP stack: Pub/Sub, Spot VM managed instance groups, Firestore, the Cloud Function scaler."""
