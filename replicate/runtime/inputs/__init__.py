"""Input: sharding an in-memory dataset (``data``), ``input_fn`` run ahead on a background
thread (``prefetch``), batches staged on the device there (``staging``)."""
