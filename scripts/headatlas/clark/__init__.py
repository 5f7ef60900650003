"""Clark et al. 2019, What Does BERT Look At?: surface patterns, gradients, clustering, syntax, coreference, parsing probes."""
