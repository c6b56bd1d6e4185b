"""A MirroredStrategy over N logical CPUs: what the test workers of the
in-process engine (--engine mirrored) run on. Call it before TensorFlow has
started (logical devices cannot change afterwards).

SOK_GRAPH_TEST_MIRRORED_ON=GPU puts the replicas on the first N physical
GPUs instead (a machine with several GPUs): each replica then holds its
shards in its GPU's memory and runs its ops there. LOGICAL_GPU cuts the
first GPU into N logical ones (a one-GPU machine)."""

import os


def mirrored_strategy_on_cpus(n):
    import tensorflow as tf

    # The tf.config.experimental spellings: TF 1.15 has only those.
    config = tf.config.experimental
    where = os.environ.get("SOK_GRAPH_TEST_MIRRORED_ON", "").upper()
    if where == "LOGICAL_GPU":
        # n logical GPUs cut from the first one: the replicas' exchanges run
        # GPU kernels on a one-GPU machine (TensorFlow's copies between
        # them; NCCL takes one rank per physical GPU).
        gpus = config.list_physical_devices("GPU")
        if not gpus:
            raise RuntimeError("SOK_GRAPH_TEST_MIRRORED_ON=LOGICAL_GPU needs a GPU")
        config.set_virtual_device_configuration(
            gpus[0], [config.VirtualDeviceConfiguration(memory_limit=4096)] * n)
        return tf.distribute.MirroredStrategy([f"/gpu:{i}" for i in range(n)])
    if where == "GPU":
        gpus = config.list_physical_devices("GPU")
        if len(gpus) < n:
            raise RuntimeError(f"SOK_GRAPH_TEST_MIRRORED_ON=GPU needs {n} GPUs; this machine "
                               f"has {len(gpus)}")
        return tf.distribute.MirroredStrategy([f"/gpu:{i}" for i in range(n)])
    cpu = config.list_physical_devices("CPU")[0]
    config.set_virtual_device_configuration(cpu, [config.VirtualDeviceConfiguration()] * n)
    return tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(n)])
