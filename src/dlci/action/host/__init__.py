"""The host side of the action: preflight, the image, the containers, the gates' bookkeeping,
cleanup and the summary. Host-side: never imports torch."""
