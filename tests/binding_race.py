"""A fresh process that starts as a load does (the engine imported as `ovtrio serve`
imports it, or a load's second thread started as the load starts it) and then reads
engine data as numpy arrays on two threads at the same moment: a tokenizer IR's
constant (Constant.get_data(), what plain_text.py reads beside the engine) and the
token ids of an encoding (Tensor.data, what vocabulary.py reads on the loading thread).
Prints "read" once both have. Arguments: the tokenizer IR's folder, and how the start
is made: "import" (load_thread.import_engine) or "load" (load_tables.LoadTables)."""

from __future__ import annotations

import sys
import threading
from pathlib import Path


def main() -> None:
    folder, start = Path(sys.argv[1]), sys.argv[2]
    if start == "import":
        from ovtrio.loading.thread import import_engine

        import_engine()
    import openvino as ov
    import openvino_genai
    import openvino_tokenizers  # noqa: F401 (registers the tokenizer operations)

    # What each thread reads, made without reading any data yet.
    model = ov.Core().read_model(folder / "openvino_tokenizer.xml")
    split = next(op for op in model.get_ordered_ops() if op.get_type_name() == "SpecialTokensSplit")
    constant = split.input(split.get_input_size() - 1).get_source_output().get_node()
    ids = openvino_genai.Tokenizer(str(folder)).encode("Hello", add_special_tokens=True).input_ids
    together = threading.Barrier(2)

    def beside() -> None:
        together.wait()
        constant.get_data()

    def reads() -> None:
        thread = threading.Thread(target=beside)
        thread.start()
        together.wait()
        ids.data  # noqa: B018
        thread.join()

    if start == "load":
        from ovtrio.loading.tables import LoadTables
        from ovtrio.model.source import embedded_model_path

        with LoadTables(embedded_model_path(), "gguf", -1):
            reads()
    else:
        reads()
    print("read", flush=True)


if __name__ == "__main__":
    main()
