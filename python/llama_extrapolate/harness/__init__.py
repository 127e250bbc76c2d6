"""The evaluation harness: calibration (attention alignment), streaming NLL, passkey and needle tasks, receptive
fields, attention statistics, corpora and figures.

It is what ``llama-extrapolate nll``, ``passkey``, ``calibrate`` and ``trf`` and the benchmarks use; ``run``,
``serve`` and ``Llama`` never import it. Its figures need matplotlib, installed by the ``eval`` extra
(``pip install 'llama-extrapolate[eval]'``; ``[test]`` and ``[bench]`` include it): ``plots`` imports it only
when it draws, and the commands that draw refuse at their start, naming the extra, when it is missing.
"""
