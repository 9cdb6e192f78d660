# ours.sh - end-to-end cases for our module only (sourced by suite.sh --impl ours).
