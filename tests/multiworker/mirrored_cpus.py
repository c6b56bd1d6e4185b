"""A MirroredStrategy over N logical CPUs: what the test workers of the
in-process engine (--engine mirrored) run on. Call it before TensorFlow has
started (logical devices cannot change afterwards)."""


def mirrored_strategy_on_cpus(n):
    import tensorflow as tf

    # The tf.config.experimental spellings: TF 1.15 has only those.
    config = tf.config.experimental
    cpu = config.list_physical_devices("CPU")[0]
    config.set_virtual_device_configuration(cpu, [config.VirtualDeviceConfiguration()] * n)
    return tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(n)])
