"""Training dynamics per row, fed back into the data: the recorder (`recorder`), its file
``RUN/dynamics.arrow`` (`file`), the loop's hook (`hook`) and the rows of anomalies with their
stage scores (`rows`)."""
