"""The foundation: settings (config), errors, files, the cache, run folders, the hub, encoder
families, models and their adaptor, shapes, and the data sets (data/). It imports nothing above
it."""
