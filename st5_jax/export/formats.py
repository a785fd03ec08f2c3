"""The export formats `st5 export --format` and `export_model` accept (no imports: the package's
__init__ and api.py both read it, so neither imports the other back)."""

FORMATS = ("savedmodel", "sentence-transformers")
