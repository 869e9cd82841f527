"""The Spark batch pipeline: each step a function DataFrame -> DataFrame; job.py chains them."""
