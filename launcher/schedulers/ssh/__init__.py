"""Reaching a cluster's login node over SSH from another machine: the profile's `login:`
(`login`: its fields checked, the ssh command line), one multiplexed connection per glaunch
command whose every remote call is bounded (`connection`), and a directory sent in one
transfer that appears on the cluster whole or not at all (`transfer`)."""
