OVERRIDES: dict = {}
