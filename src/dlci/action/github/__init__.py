"""GitHub's services: the REST API, baseline artifacts, the comparison, the comment, history."""
