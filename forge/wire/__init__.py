"""The wire: what the workflow, activities and clients exchange, and pure views of it."""
