"""AWS constructs of one tidefleet environment; `stack.AwsFleetStack` composes them."""
