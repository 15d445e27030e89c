"""Training and offline evaluation of cost models: TenSet's metrics and dataset splits."""
