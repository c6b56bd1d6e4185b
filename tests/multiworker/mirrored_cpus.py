"""A MirroredStrategy over N logical CPUs: what the test workers of the
in-process engine (--engine mirrored) run on. Call it before TensorFlow has
started (logical devices cannot change afterwards)."""


def mirrored_strategy_on_cpus(n):
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * n)
    return tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(n)])
