"""TileLang backends."""
