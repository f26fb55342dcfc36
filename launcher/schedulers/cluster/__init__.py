"""The live cluster: its facts from scontrol and sinfo (`facts`, `scontrol_text`), a
profile checked against them as small rules (`check`, `partition`, `report`: `glaunch sites
check`), and a profile written from them (`detect`: `glaunch sites detect`)."""
